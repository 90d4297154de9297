"""Loss functions: cross entropy, RL losses, embedding losses."""
