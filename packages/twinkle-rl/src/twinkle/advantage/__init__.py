"""Advantage estimators (GRPO and friends)."""
