"""Training and evaluation metrics."""
