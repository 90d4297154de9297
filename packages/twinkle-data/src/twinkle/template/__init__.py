"""Chat templates: Trajectory in, InputFeature (input_ids, labels, position_ids) out."""
