"""Policy-gradient losses for RL on sampled completions: GRPO, GSPO and CISPO.

Each reads ``inputs['labels']`` (the completion tokens are the label tokens), the policy's
``logps`` from ``outputs`` (any form ``twinkle.loss.logps`` accepts), and, from the
keyword arguments of ``forward_backward`` or from ``inputs``:

* ``advantages``: one per sequence (B,) or per token (B, T);
* ``old_logps``: the sampling policy's logps of the same tokens, aligned with labels
  (B, T), or a list of one row per sequence holding the label tokens' values only (what a
  sampler returns). Missing: the batch is taken as on-policy and ``logps.detach()`` is
  used, so every ratio is 1 and only its gradient remains;
* ``ref_logps`` (GRPO with ``beta > 0``): the reference model's logps, same layout.

Per-sequence advantages and GSPO's sequence ratio treat a row as one sequence: do not
pack several completions into one row for them.

Each loss also returns ``policy_stats``: detached sums over the batch's label tokens (ratio
statistics, clipped units, the k3 estimate of KL(sampler || policy), the reference KL) that
``twinkle.metric.PolicyMetric`` turns into clip fraction, ratio, KL and mismatch figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from twinkle.loss.base import Loss
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
from twinkle.loss.logps import token_logps
from twinkle.loss.registry import LOSSES

_ADVANTAGES_HINT = (
    "pass forward_backward(..., advantages=...) with one value per sequence (B,) "
    "or per token (B, T), e.g. from twinkle.advantage"
)
_OLD_HINT = "pass old_logps once: as a keyword of forward_backward or in inputs"
_REF_HINT = (
    "beta > 0 adds a KL penalty to a reference model; pass ref_logps (B, T) aligned with "
    "labels (or per-sequence lists of the label tokens' values), or set beta=0"
)


class _Policy(NamedTuple):
    labels: torch.Tensor  # (B, T) int64
    mask: torch.Tensor  # (B, T) bool, label tokens
    num_tokens: torch.Tensor  # 0-dim int64
    logps: torch.Tensor  # (B, T), differentiable
    log_ratio: torch.Tensor  # (B, T), logps - old_logps on label tokens, 0 elsewhere
    advantages: torch.Tensor  # (B,) or (B, T)
    from_sampler: bool  # old_logps were given (else the batch is taken as on-policy)


def _policy(
    owner: str, inputs: Mapping[str, Any], outputs: Mapping[str, Any], kwargs: Mapping[str, Any]
) -> _Policy:
    labels = token_labels(inputs, owner, outputs_device(outputs))
    mask = label_mask(labels)
    num_tokens = count_label_tokens(mask, owner)
    advantages = require("advantages", inputs, kwargs, owner=owner, hint=_ADVANTAGES_HINT)
    logps = token_logps(outputs, labels, owner=owner).logps
    advantages = per_sequence_or_token(advantages, labels, name="advantages", dtype=logps.dtype)
    old = fetch("old_logps", inputs, kwargs, owner=owner, hint=_OLD_HINT)
    from_sampler = old is not None
    if old is None:
        old = logps.detach()
    else:
        old = align_to_labels(old, labels, name="old_logps", dtype=logps.dtype)
    log_ratio = torch.where(mask, logps - old, 0)
    return _Policy(labels, mask, num_tokens, logps, log_ratio, advantages, from_sampler)


@torch.no_grad()
def _policy_stats(
    policy: _Policy,
    clipped: torch.Tensor,
    clip_units: torch.Tensor,
    ref_kl: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Sums over the label tokens for PolicyMetric; ``clipped`` flags the units (tokens, or
    sequences for GSPO) whose clip was active, out of ``clip_units``."""
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


def _clip_active(
    ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """Where the clip decides the term: a positive advantage with the ratio above ``high``,
    or a negative one with the ratio below ``low``."""
    return ((advantages > 0) & (ratio > high)) | ((advantages < 0) & (ratio < low))


def _check_epsilons(owner: str, epsilon: float, epsilon_high: float) -> None:
    if not 0 < epsilon < 1:
        raise ValueError(f"{owner}: epsilon must lie in (0, 1), got {epsilon}")
    if epsilon_high <= 0:
        raise ValueError(f"{owner}: epsilon_high must be positive, got {epsilon_high}")


def _clipped_objective(
    ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """``min(ratio * A, clip(ratio, low, high) * A)``: the pessimistic PPO surrogate."""
    return torch.minimum(ratio * advantages, ratio.clamp(low, high) * advantages)


@LOSSES.register
class GRPOLoss(Loss):
    """Token-level clipped policy gradient, normalised by label tokens.

    For each label token t with ``r_t = exp(logp_t - old_logp_t)`` and advantage ``A``
    (the sequence's, or the token's)::

        l_t = -min(r_t * A, clip(r_t, 1 - epsilon, 1 + epsilon_high) * A)
              + beta * (exp(ref_t - logp_t) - (ref_t - logp_t) - 1)

    The last term is the k3 estimator of KL(policy || reference), added only when
    ``beta > 0``. ``loss = sum_t l_t`` over all label tokens of the batch,
    ``num_tokens`` = their count: every token weighs the same across sequences (the
    token-level normalisation of DAPO), not GRPO's per-sequence mean. ``epsilon_high``
    defaults to ``epsilon``.
    """

    def __init__(
        self, epsilon: float = 0.2, epsilon_high: float | None = None, beta: float = 0.0
    ) -> None:
        self.epsilon = epsilon
        self.epsilon_high = epsilon if epsilon_high is None else epsilon_high
        self.beta = beta
        _check_epsilons(type(self).__name__, self.epsilon, self.epsilon_high)
        if beta < 0:
            raise ValueError(f"GRPOLoss: beta must be >= 0, got {beta}")

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = type(self).__name__
        policy = _policy(owner, inputs, outputs, kwargs)
        advantages = policy.advantages
        if advantages.ndim == 1:
            advantages = advantages[:, None]
        ratio = torch.exp(policy.log_ratio)
        low, high = 1 - self.epsilon, 1 + self.epsilon_high
        per_token = -_clipped_objective(ratio, advantages, low, high)
        ref_kl = None
        if self.beta > 0:
            ref = require("ref_logps", inputs, kwargs, owner=owner, hint=_REF_HINT)
            ref = align_to_labels(ref, policy.labels, name="ref_logps", dtype=policy.logps.dtype)
            delta = torch.where(policy.mask, ref - policy.logps, 0)
            kl = torch.exp(delta) - delta - 1
            per_token = per_token + self.beta * kl
            ref_kl = kl[policy.mask]
        loss = torch.where(policy.mask, per_token, 0).sum()
        clipped = _clip_active(ratio, advantages.expand_as(ratio), low, high)[policy.mask]
        stats = _policy_stats(policy, clipped, policy.num_tokens, ref_kl)
        return {"loss": loss, "num_tokens": policy.num_tokens, "policy_stats": stats}


@LOSSES.register
class GSPOLoss(Loss):
    """Sequence-level clipped policy gradient (GSPO), normalised by sequences.

    For sequence i with label tokens T_i and advantage ``A_i`` (per sequence only)::

        s_i = exp(mean over t in T_i of (logp_t - old_logp_t))
        l_i = -min(s_i * A_i, clip(s_i, 1 - epsilon, 1 + epsilon_high) * A_i)

    ``loss = sum_i l_i``; ``num_tokens`` counts the sequences that have label tokens
    (rows without any contribute nothing and are not counted). The ratio is a geometric
    mean over the sequence, so the clip range is much narrower than GRPO's: the defaults
    (3e-4, 4e-4) are the ones the GSPO paper reports.
    """

    def __init__(self, epsilon: float = 3e-4, epsilon_high: float | None = 4e-4) -> None:
        self.epsilon = epsilon
        self.epsilon_high = epsilon if epsilon_high is None else epsilon_high
        _check_epsilons(type(self).__name__, self.epsilon, self.epsilon_high)

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = type(self).__name__
        policy = _policy(owner, inputs, outputs, kwargs)
        if policy.advantages.ndim != 1:
            raise ValueError(
                f"{owner} weighs whole sequences: pass one advantage per sequence (B,), "
                f"got shape {tuple(policy.advantages.shape)}"
            )
        lengths = policy.mask.sum(dim=1)
        has_tokens = lengths > 0
        ratio = torch.exp(policy.log_ratio.sum(dim=1) / lengths.clamp(min=1))
        per_sequence = -_clipped_objective(
            ratio, policy.advantages, 1 - self.epsilon, 1 + self.epsilon_high
        )
        loss = torch.where(has_tokens, per_sequence, 0).sum()
        low, high = 1 - self.epsilon, 1 + self.epsilon_high
        clipped = _clip_active(ratio, policy.advantages, low, high)[has_tokens]
        stats = _policy_stats(policy, clipped, has_tokens.sum())
        return {"loss": loss, "num_tokens": has_tokens.sum(), "policy_stats": stats}


@LOSSES.register
class CISPOLoss(Loss):
    """Clipped importance-sampling-weight policy gradient (CISPO), normalised by tokens.

    For each label token t with ``r_t = exp(logp_t - old_logp_t)``::

        w_t = stop_gradient(clip(r_t, 1 - epsilon_low, 1 + epsilon_high))
        l_t = -w_t * A * logp_t

    Unlike GRPO, a token whose ratio leaves the range keeps its gradient ``-w_t * A``
    (the weight is capped, the token is not dropped). Without ``epsilon_low`` there is no
    lower bound. ``loss = sum_t l_t``, ``num_tokens`` = label tokens. The loss value is a
    surrogate whose gradient is the CISPO gradient, not an objective to read.
    ``epsilon_high`` = 4.0 (weights capped at 5) is our default, chosen to cap only
    clearly stale tokens; tune it for your data.
    """

    def __init__(self, epsilon_high: float = 4.0, epsilon_low: float | None = None) -> None:
        if epsilon_high <= 0:
            raise ValueError(f"CISPOLoss: epsilon_high must be positive, got {epsilon_high}")
        if epsilon_low is not None and not 0 < epsilon_low <= 1:
            raise ValueError(f"CISPOLoss: epsilon_low must lie in (0, 1], got {epsilon_low}")
        self.epsilon_high = epsilon_high
        self.epsilon_low = epsilon_low

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        policy = _policy(type(self).__name__, inputs, outputs, kwargs)
        advantages = policy.advantages
        if advantages.ndim == 1:
            advantages = advantages[:, None]
        low = None if self.epsilon_low is None else 1 - self.epsilon_low
        ratio = torch.exp(policy.log_ratio)
        weight = ratio.clamp(low, 1 + self.epsilon_high).detach()
        per_token = -weight * advantages * policy.logps
        loss = torch.where(policy.mask, per_token, 0).sum()
        # CISPO caps the weight on either side whatever the advantage's sign.
        capped = ratio > 1 + self.epsilon_high
        if low is not None:
            capped |= ratio < low
        stats = _policy_stats(policy, capped[policy.mask], policy.num_tokens)
        return {"loss": loss, "num_tokens": policy.num_tokens, "policy_stats": stats}
