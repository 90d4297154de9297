"""Preprocessors that turn raw dataset rows into Trajectories."""
