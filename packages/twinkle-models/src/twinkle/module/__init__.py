"""Optimizers and learning-rate schedulers by registry name."""
