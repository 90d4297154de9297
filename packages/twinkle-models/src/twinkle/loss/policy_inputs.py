"""What every policy-gradient loss reads and reports: the batch's label tokens, the
policy's logps, the importance ratio against the sampler's ``old_logps``, the advantages,
the KL to a reference, and the detached ``policy_stats`` sums PolicyMetric reads.

Conventions (``twinkle.loss.base``): advantages are one per sequence (B,) or per token
(B, T); ``old_logps`` and ``ref_logps`` are (B, T) aligned with labels or per-sequence lists
of the label tokens' values (what a sampler returns).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from twinkle.loss.fields import (
    align_to_labels,
    count_label_tokens,
    fetch,
    label_mask,
    outputs_device,
    per_sequence_or_token,
    require,
    token_labels,
)
from twinkle.loss.kl import kl_estimate
from twinkle.loss.logps import token_logps

ADVANTAGES_HINT = (
    "pass forward_backward(..., advantages=...) with one value per sequence (B,) "
    "or per token (B, T), e.g. from twinkle.advantage"
)
OLD_HINT = "pass old_logps once: as a keyword of forward_backward or in inputs"
OLD_REQUIRED_HINT = (
    "pass old_logps, the sampling policy's logps of the same tokens (the sampler's "
    "[lp[0][1] for lp in seq.logprobs] per sequence, or model.forward_only(...).logps before "
    "the update): the clipped ratio compares the updated policy with the one that sampled"
)
REF_HINT = (
    "beta > 0 adds a KL penalty to a reference policy; pass ref_logps (B, T) aligned with "
    "labels (or per-sequence lists of the label tokens' values): for a LoRA policy "
    "model.reference_logps(inputs) (the same model with the adapter disabled), otherwise a "
    "frozen model's forward_only(inputs).logps; or set beta=0"
)


class PolicyInputs(NamedTuple):
    labels: torch.Tensor  # (B, T) int64
    mask: torch.Tensor  # (B, T) bool, label tokens
    num_tokens: torch.Tensor  # 0-dim int64
    logps: torch.Tensor  # (B, T), differentiable
    log_ratio: torch.Tensor  # (B, T), logps - old_logps on label tokens, 0 elsewhere
    advantages: torch.Tensor  # (B,) or (B, T)
    from_sampler: bool  # old_logps were given (else the batch is taken as on-policy)

    def token_advantages(self) -> torch.Tensor:
        """Advantages broadcastable against (B, T)."""
        return self.advantages[:, None] if self.advantages.ndim == 1 else self.advantages


def read_policy(
    owner: str,
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    *,
    old_required: bool = False,
) -> PolicyInputs:
    """The loss inputs of a policy-gradient batch; without ``old_logps`` (unless
    ``old_required``) the batch is on-policy and ``logps.detach()`` stands in for them."""
    labels = token_labels(inputs, owner, outputs_device(outputs))
    mask = label_mask(labels)
    num_tokens = count_label_tokens(mask, owner)
    advantages = require("advantages", inputs, kwargs, owner=owner, hint=ADVANTAGES_HINT)
    if old_required:
        require("old_logps", inputs, kwargs, owner=owner, hint=OLD_REQUIRED_HINT)
    logps = token_logps(outputs, labels, owner=owner).logps
    advantages = per_sequence_or_token(advantages, labels, name="advantages", dtype=logps.dtype)
    old = fetch("old_logps", inputs, kwargs, owner=owner, hint=OLD_HINT)
    from_sampler = old is not None
    if old is None:
        old = logps.detach()
    else:
        old = align_to_labels(old, labels, name="old_logps", dtype=logps.dtype)
    log_ratio = torch.where(mask, logps - old, 0)
    return PolicyInputs(labels, mask, num_tokens, logps, log_ratio, advantages, from_sampler)


def reference_kl(
    owner: str,
    policy: PolicyInputs,
    inputs: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    estimator: str,
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) (0 off the labels), differentiable
    through the policy's logps; ``ref_logps`` is required."""
    ref = require("ref_logps", inputs, kwargs, owner=owner, hint=REF_HINT)
    ref = align_to_labels(ref, policy.labels, name="ref_logps", dtype=policy.logps.dtype)
    return torch.where(policy.mask, kl_estimate(policy.logps, ref, estimator), 0)


@torch.no_grad()
def policy_stats(
    policy: PolicyInputs,
    clipped: torch.Tensor,
    clip_units: torch.Tensor,
    ref_kl: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Sums over the label tokens for PolicyMetric; ``clipped`` flags the units (tokens, or
    sequences for GSPO) whose clip was active, out of ``clip_units``; ``ref_kl`` holds the
    reference KL of the label tokens."""
    log_ratio = policy.log_ratio[policy.mask]
    ratio = torch.exp(log_ratio)
    stats = {
        "tokens": policy.mask.sum(),
        "ratio_sum": ratio.sum(),
        "ratio_dev_sq_sum": (ratio - 1).square().sum(),
        "ratio_min": ratio.min(),
        "ratio_max": ratio.max(),
        "old_kl_sum": (ratio - 1 - log_ratio).sum(),
        "abs_log_ratio_sum": log_ratio.abs().sum(),
        "from_sampler": torch.tensor(policy.from_sampler),
        "clipped": clipped.sum(),
        "clip_units": clip_units,
    }
    if ref_kl is not None:
        stats["ref_kl_sum"] = ref_kl.sum()
    return stats


def clip_active(
    ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """Where the clip decides the term: a positive advantage with the ratio above ``high``,
    or a negative one with the ratio below ``low``."""
    return ((advantages > 0) & (ratio > high)) | ((advantages < 0) & (ratio < low))


def check_epsilons(owner: str, epsilon: float, epsilon_high: float) -> None:
    if not 0 < epsilon < 1:
        raise ValueError(f"{owner}: epsilon must lie in (0, 1), got {epsilon}")
    if not epsilon_high > 0:
        raise ValueError(f"{owner}: epsilon_high must be positive, got {epsilon_high}")


def check_beta(owner: str, beta: float) -> float:
    if not beta >= 0 or beta == float("inf"):
        raise ValueError(
            f"{owner}: beta (the KL coefficient) must be a finite number >= 0, got {beta}"
        )
    return beta


def clipped_objective(
    ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """``min(ratio * A, clip(ratio, low, high) * A)``: the pessimistic PPO surrogate (also
    the Tinker service's ``ppo`` loss)."""
    return torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)
