"""PPO with a critic: the clipped policy loss and the clipped value loss.

The policy loss trains the language model on per-token advantages (``GAEAdvantage``), the
value loss trains a ``TransformersValueModel`` towards the returns. Both are normalised by
label tokens (the completion), and both read per-token inputs aligned with labels (B, T)
or as per-sequence lists of the label tokens' values (``twinkle.loss.fields``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.loss.base import Loss, LossInputs
from twinkle.loss.fields import (
    align_to_labels,
    count_label_tokens,
    fetch,
    label_mask,
    outputs_device,
    require,
    token_labels,
)
from twinkle.loss.registry import LOSSES
from twinkle.loss.rl import GRPOLoss

_RETURNS_HINT = (
    "pass returns, the value targets of each label token: the second result of "
    "GAEAdvantage()(rewards, values, masks=...), (B, T) aligned with labels"
)
_OLD_VALUES_HINT = (
    "value clipping (epsilon) keeps the new values within epsilon of those the advantages "
    "were computed with: pass old_values (the value model's forward_only(...)['values'] of the "
    "same batch, before the update), or build PPOValueLoss(epsilon=None) to train unclipped"
)


@LOSSES.register
class PPOLoss(GRPOLoss):
    """The clipped PPO policy loss over per-token (or per-sequence) advantages::

        l_t = -min(r_t * A_t, clip(r_t, 1 - epsilon, 1 + epsilon_high) * A_t) + beta * KL_t

    with, when ``dual_clip`` = c > 1 is given, a lower bound ``-c * A_t`` on the objective of
    negative-advantage tokens (dual-clip PPO: a huge ratio on a bad token cannot dominate
    the batch). ``old_logps`` are required: PPO reuses a rollout over several updates, and
    without the sampling policy's logps there is no ratio to clip. Normalised by label
    tokens. The Tinker service's ``ppo`` loss is this surrogate.
    """

    old_logps_required = True
    reads = LossInputs(required=("advantages", "old_logps"), optional=("ref_logps",))

    def __init__(
        self,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        kl_estimator: str = "k3",
        dual_clip: float | None = None,
    ) -> None:
        super().__init__(epsilon, epsilon_high, beta, kl_estimator)
        if dual_clip is not None and not 1 < dual_clip < float("inf"):
            raise ValueError(f"PPOLoss: dual_clip must be a finite number > 1, got {dual_clip}")
        self.dual_clip = dual_clip

    def token_terms(self, policy, ratio, advantages):
        per_token, clipped = super().token_terms(policy, ratio, advantages)
        if self.dual_clip is None:
            return per_token, clipped
        bound = -self.dual_clip * advantages  # the loss of a negative advantage stays <= c|A|
        dual = (advantages < 0) & (per_token > bound)
        return torch.where(dual, bound, per_token), clipped | dual


@LOSSES.register
class PPOValueLoss(Loss):
    """The clipped value loss of PPO, normalised by label tokens::

        V_clip = old_V + clip(V - old_V, -epsilon, epsilon)
        l_t = 0.5 * max((V_t - R_t) ** 2, (V_clip_t - R_t) ** 2)

    ``V`` is ``outputs['values']`` (B, T) aligned with labels (what a
    ``TransformersValueModel`` produces: ``values[b, t]`` estimates the return from the
    state before label token t), ``R`` the ``returns``, ``old_V`` the ``old_values`` the
    advantages were computed with. ``epsilon=None`` trains the plain squared error (no
    ``old_values`` needed). Also returns ``value_stats`` (detached sums for PPOMetric:
    clipped tokens, squared error, returns' first two moments for explained variance).
    """

    reads = LossInputs(required=("returns",), optional=("old_values",))

    def __init__(self, epsilon: float | None = 0.2) -> None:
        if epsilon is not None and not 0 < epsilon < float("inf"):
            raise ValueError(
                f"PPOValueLoss: epsilon (the value clip range) must be a positive finite "
                f"number or None, got {epsilon}"
            )
        self.epsilon = epsilon

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = type(self).__name__
        labels = token_labels(inputs, owner, outputs_device(outputs))
        mask = label_mask(labels)
        num_tokens = count_label_tokens(mask, owner)
        values = outputs.get("values")
        if values is None:
            raise ValueError(
                f"{owner} needs outputs['values'] (B, T), a value head's estimate per token: "
                f"train it on a TransformersValueModel (twinkle.model), which produces them"
            )
        if values.shape != labels.shape:
            raise ValueError(
                f"{owner}: outputs['values'] has shape {tuple(values.shape)} but labels have "
                f"{tuple(labels.shape)}; values must be aligned with labels"
            )
        dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
        values = values.to(dtype)
        returns = require("returns", inputs, kwargs, owner=owner, hint=_RETURNS_HINT)
        returns = align_to_labels(returns, labels, name="returns", dtype=dtype)
        error = (values - returns).square()
        clipped = torch.zeros_like(mask)
        if self.epsilon is not None:
            old = fetch("old_values", inputs, kwargs, owner=owner, hint=_OLD_VALUES_HINT)
            if old is None:
                raise ValueError(f"{owner} needs old_values: {_OLD_VALUES_HINT}")
            old = align_to_labels(old, labels, name="old_values", dtype=dtype)
            near = old + (values - old).clamp(-self.epsilon, self.epsilon)
            clipped_error = (near - returns).square()
            clipped = clipped_error > error
            error = torch.maximum(error, clipped_error)
        loss = 0.5 * torch.where(mask, error, 0).sum()
        with torch.no_grad():
            kept = returns[mask]
            stats = {
                "tokens": mask.sum(),
                "clipped": clipped[mask].sum(),
                "squared_error_sum": (values - returns)[mask].square().sum(),
                "returns_sum": kept.sum(),
                "returns_sq_sum": kept.square().sum(),
                "values_sum": values[mask].sum(),
            }
        return {"loss": loss, "num_tokens": num_tokens, "value_stats": stats}
