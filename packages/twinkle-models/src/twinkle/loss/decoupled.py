"""Decoupled PPO for asynchronous RL: the behaviour policy that sampled a batch (a stale
sampler, up to ``max_staleness`` versions behind, ``twinkle.rollout.AsyncRollouts``) is kept
apart from the proximal policy the update is clipped against (the trainer's policy just
before this update).

The plain clipped loss clips ``pi / pi_behaviour``: with stale samples its trust region is
centred on an old policy, so the clip is active on many tokens before the update has moved
at all. The decoupled objective (Hilton et al., "Batch size-invariance for policy
optimization", 2022; used for asynchronous RL by AReaL, Fu et al. 2025) corrects the
sampling with an importance weight and clips against the proximal policy. Per label token::

    w_t = min(pi_prox_t / pi_behaviour_t, max_weight)      (detached: truncated IS)
    r_t = pi_t / pi_prox_t
    l_t = -w_t * min(r_t * A_t, clip(r_t, 1 - epsilon, 1 + epsilon_high) * A_t) + beta * KL_t

``old_logps`` are the behaviour policy's (the sampler's logprobs, as for every policy loss);
``prox_logps`` the proximal policy's: ``model.policy_logps(inputs)`` with the trainer's
weights just before the update. With ``prox_logps == old_logps`` every weight is 1 and
the loss is GRPOLoss's exactly (values and gradients).

The weight is truncated at ``max_weight`` (its gradient-free factor clamped, as in truncated
importance sampling); AReaL instead drops the tokens above its cap. Both bound the variance
the stale tokens add; truncation keeps their (bounded) signal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.loss.base import LossInputs
from twinkle.loss.fields import align_to_labels, fetch, require
from twinkle.loss.policy_inputs import OLD_HINT, PolicyInputs, clip_active, clipped_objective
from twinkle.loss.registry import LOSSES
from twinkle.loss.rl import GRPOLoss

PROX_HINT = (
    "pass prox_logps, the proximal policy's logps of the same tokens: the trainer's "
    "model.policy_logps(inputs) just before this update, (B, T) aligned with labels (or "
    "per-sequence lists of the label tokens' values); old_logps stay the sampler's (the "
    "behaviour policy)"
)


@LOSSES.register
class DecoupledPPOLoss(GRPOLoss):
    """The decoupled clipped loss (module docstring), normalised by label tokens like
    GRPOLoss.

    ``max_weight`` truncates the behaviour-to-proximal importance weight (None:
    untruncated). ``policy_stats`` report the ratio against the behaviour policy as every
    policy loss does (``policy/ratio_*``, ``kl_old``), count a token as clipped where the
    proximal clip is active or its weight was truncated, and add the weights' sum, maximum
    and truncated count (``policy/is_weight_mean``, ``is_weight_max``,
    ``is_truncated_fraction``).
    """

    reads = LossInputs(required=("advantages", "old_logps", "prox_logps"), optional=("ref_logps",))

    old_logps_required = True

    def __init__(
        self,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        kl_estimator: str = "k3",
        max_weight: float | None = 5.0,
    ) -> None:
        super().__init__(epsilon, epsilon_high, beta, kl_estimator)
        if max_weight is not None and not 1 <= max_weight < float("inf"):
            raise ValueError(
                f"DecoupledPPOLoss: max_weight must be a finite number >= 1 or None "
                f"(untruncated), got {max_weight}"
            )
        self.max_weight = max_weight

    def read_extra(
        self,
        owner: str,
        policy: PolicyInputs,
        inputs: Mapping[str, Any],
        kwargs: Mapping[str, Any],
    ) -> dict[str, Any]:
        dtype = policy.logps.dtype
        raw = require("prox_logps", inputs, kwargs, owner=owner, hint=PROX_HINT)
        prox = align_to_labels(raw, policy.labels, name="prox_logps", dtype=dtype)
        old = fetch("old_logps", inputs, kwargs, owner=owner, hint=OLD_HINT)
        old = align_to_labels(old, policy.labels, name="old_logps", dtype=dtype)
        prox, old = (torch.where(policy.mask, x, 0) for x in (prox, old))
        weight = torch.exp(prox - old)
        truncated = torch.zeros_like(policy.mask)
        if self.max_weight is not None:
            truncated = policy.mask & (weight > self.max_weight)
            weight = weight.clamp(max=self.max_weight)
        return {"prox": prox, "weight": weight, "truncated": truncated}

    def token_terms(self, policy, ratio, advantages, *, prox, weight, truncated):
        proximal_ratio = torch.exp(torch.where(policy.mask, policy.logps - prox, 0))
        low, high = 1 - self.epsilon, 1 + self.epsilon_high
        per_token = -weight * clipped_objective(proximal_ratio, advantages, low, high)
        clipped = clip_active(proximal_ratio, advantages, low, high) | truncated
        return per_token, clipped

    @torch.no_grad()
    def extra_stats(self, policy, *, prox, weight, truncated):
        on_labels = weight[policy.mask]
        return {
            "is_weight_sum": on_labels.sum(),
            "is_weight_max": on_labels.max(),
            "is_truncated": truncated.sum(),
        }
