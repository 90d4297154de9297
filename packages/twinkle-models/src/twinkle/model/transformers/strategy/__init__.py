"""Parallel strategies applied to a plain Hugging Face model (see ``parallelize``)."""

from twinkle.model.transformers.strategy.parallelize import ParallelPlan, check_mesh, parallelize

__all__ = ["ParallelPlan", "check_mesh", "parallelize"]
