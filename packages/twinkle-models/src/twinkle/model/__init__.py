"""TwinkleModel and its backends, and the parallel strategies applied to them."""
