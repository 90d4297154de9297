"""Reward functions over Trajectories."""
