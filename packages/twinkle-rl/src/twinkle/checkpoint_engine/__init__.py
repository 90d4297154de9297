"""Weight sync from the trained model to the sampler."""
