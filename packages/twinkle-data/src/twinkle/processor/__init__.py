"""InputProcessor: pads or packs lists of InputFeatures into model tensors."""
