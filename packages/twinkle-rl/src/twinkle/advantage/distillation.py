"""On-policy distillation's advantage: the per-token reverse KL to a teacher."""

from __future__ import annotations

from typing import Any

import torch

from twinkle.advantage.base import Advantage
from twinkle.advantage.token_inputs import token_grid


class ReverseKLAdvantage(Advantage):
    """On-policy distillation: the student samples, the teacher scores the sampled tokens,
    and each token's advantage is minus its sampled estimate of the reverse KL::

        A_t = -kl_coef * (student_logp_t - teacher_logp_t)

    so tokens the teacher finds likelier than the student are pushed up. ``center=True``
    (the default) subtracts the batch's mean over its completion tokens, a baseline: the
    gradient's expectation is unchanged, but without it every advantage is negative (the
    reverse KL is positive on average) and the policy gradient pushes down whatever the
    student samples, which spread the student and raised its KL to the teacher in the
    distillation recipe (``cookbook/rl/distil_arithmetic.py``); ``center=False`` returns
    the raw estimate, whose mean is minus the sampled KL. Train with a
    policy loss on these per-token advantages (``GRPOLoss`` or ``PPOLoss`` with the
    student's sampling logps as ``old_logps``). Inputs are (B, T) aligned with labels with
    a ``masks`` of the completion tokens, or one list per completion (the sampler's
    logprobs and the teacher's ``forward_only(...).logps`` of those tokens). Returns (B, T)
    float32, 0 off the mask. The teacher is any model that scores the same tokens: another
    TransformersModel in this process or on its own Ray device group."""

    def __init__(self, kl_coef: float = 1.0, center: bool = True) -> None:
        if not 0 < kl_coef < float("inf"):
            raise ValueError(f"ReverseKLAdvantage: kl_coef must be positive, got {kl_coef}")
        if not isinstance(center, bool):
            raise TypeError(f"ReverseKLAdvantage: center must be True or False, got {center!r}")
        self.kl_coef, self.center = kl_coef, center

    def __call__(
        self, student_logps: Any, teacher_logps: Any, *, masks: Any = None
    ) -> torch.Tensor:
        grids, mask = token_grid(
            {"student_logps": student_logps, "teacher_logps": teacher_logps}, masks
        )
        advantages = -self.kl_coef * (grids["student_logps"] - grids["teacher_logps"])
        if self.center:
            advantages = advantages - advantages[mask].mean()
        return torch.where(mask, advantages, 0).float()
