"""Policy-gradient losses for RL on sampled completions: GRPO, GSPO and CISPO, and the
token-level base the GRPO family (``grpo_variants``) and PPO (``ppo``) build on.

Each reads ``inputs['labels']`` (the completion tokens are the label tokens), the policy's
``logps`` from ``outputs`` (any form ``twinkle.loss.logps`` accepts), and, from the
keyword arguments of ``forward_backward`` or from ``inputs``:

* ``advantages``: one per sequence (B,) or per token (B, T);
* ``old_logps``: the sampling policy's logps of the same tokens, aligned with labels
  (B, T), or a list of one row per sequence holding the label tokens' values only (what a
  sampler returns). Missing: the batch is taken as on-policy and ``logps.detach()`` is
  used, so every ratio is 1 and only its gradient remains (PPOLoss requires them);
* ``ref_logps`` (with ``beta > 0``): the reference policy's logps, same layout; the KL
  estimator (``kl_estimator``: k1, k2 or k3, see ``twinkle.loss.kl``) is added per token.

Per-sequence advantages and GSPO's sequence ratio treat a row as one sequence: do not
pack several completions into one row for them.

Each loss also returns ``policy_stats``: detached sums over the batch's label tokens (ratio
statistics, clipped units, the k3 estimate of KL(sampler || policy), the reference KL) that
``twinkle.metric.PolicyMetric`` turns into clip fraction, ratio, KL and mismatch figures.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import Any

import torch

from twinkle.loss.base import Loss, LossInputs
from twinkle.loss.kl import check_kl_estimator
from twinkle.loss.policy_inputs import (
    PolicyInputs,
    check_beta,
    check_epsilons,
    clip_active,
    clipped_objective,
    policy_stats,
    read_policy,
    reference_kl,
)
from twinkle.loss.registry import LOSSES


class TokenPolicyLoss(Loss):
    """A loss with one term per label token plus ``beta`` times the reference KL estimate.

    Subclasses give ``token_terms`` (each token's loss and whether its clip was active);
    ``reduce`` turns the per-token losses into ``(loss sum, normaliser)``: by default their
    sum over the label tokens and their count (DAPO's token-level normalisation, so every
    token weighs the same across sequences, micro-batches and ranks).
    """

    reads = LossInputs(required=("advantages",), optional=("old_logps", "ref_logps"))

    old_logps_required = False

    def __init__(self, beta: float = 0.0, kl_estimator: str = "k3") -> None:
        owner = type(self).__name__
        self.beta = check_beta(owner, beta)
        self.kl_estimator = check_kl_estimator(owner, kl_estimator)

    @abstractmethod
    def token_terms(
        self, policy: PolicyInputs, ratio: torch.Tensor, advantages: torch.Tensor, **extra: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's loss term, and where its clip is active (the clip fraction);
        ``extra`` is what ``read_extra`` returned."""

    def read_extra(
        self,
        owner: str,
        policy: PolicyInputs,
        inputs: Mapping[str, Any],
        kwargs: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Inputs a subclass reads beside ``PolicyInputs`` (none here), handed to
        ``token_terms`` and ``extra_stats`` as keyword arguments."""
        return {}

    def extra_stats(self, policy: PolicyInputs, **extra: Any) -> dict[str, torch.Tensor]:
        """Detached sums a subclass adds to ``policy_stats`` (none here)."""
        return {}

    def reduce(
        self, policy: PolicyInputs, per_token: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.where(policy.mask, per_token, 0).sum(), policy.num_tokens

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = type(self).__name__
        policy = read_policy(owner, inputs, outputs, kwargs, old_required=self.old_logps_required)
        advantages = policy.token_advantages().expand_as(policy.logps)
        ratio = torch.exp(policy.log_ratio)
        extra = self.read_extra(owner, policy, inputs, kwargs)
        per_token, clipped = self.token_terms(policy, ratio, advantages, **extra)
        ref_kl = None
        if self.beta > 0:
            kl = reference_kl(owner, policy, inputs, kwargs, self.kl_estimator)
            per_token = per_token + self.beta * kl
            ref_kl = kl.detach()[policy.mask]
        loss, num_tokens = self.reduce(policy, per_token)
        stats = policy_stats(policy, clipped[policy.mask], policy.num_tokens, ref_kl)
        stats.update(self.extra_stats(policy, **extra))
        return {"loss": loss, "num_tokens": num_tokens, "policy_stats": stats}


@LOSSES.register
class GRPOLoss(TokenPolicyLoss):
    """Token-level clipped policy gradient, normalised by label tokens.

    For each label token t with ``r_t = exp(logp_t - old_logp_t)`` and advantage ``A``
    (the sequence's, or the token's)::

        l_t = -min(r_t * A, clip(r_t, 1 - epsilon, 1 + epsilon_high) * A) + beta * KL_t

    ``KL_t`` is the ``kl_estimator`` (k3 by default) of KL(policy || reference), added only
    when ``beta > 0``. ``loss = sum_t l_t`` over all label tokens of the batch,
    ``num_tokens`` = their count: every token weighs the same across sequences (the
    token-level normalisation of DAPO), not GRPO's per-sequence mean. ``epsilon_high``
    defaults to ``epsilon``; a larger one is DAPO's asymmetric clip ("clip-higher").
    """

    def __init__(
        self,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        kl_estimator: str = "k3",
    ) -> None:
        super().__init__(beta, kl_estimator)
        self.epsilon = epsilon
        self.epsilon_high = epsilon if epsilon_high is None else epsilon_high
        check_epsilons(type(self).__name__, self.epsilon, self.epsilon_high)

    def token_terms(self, policy, ratio, advantages):
        low, high = 1 - self.epsilon, 1 + self.epsilon_high
        per_token = -clipped_objective(ratio, advantages, low, high)
        return per_token, clip_active(ratio, advantages, low, high)


@LOSSES.register
class CISPOLoss(TokenPolicyLoss):
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

    def __init__(
        self,
        epsilon_high: float = 4.0,
        epsilon_low: float | None = None,
        beta: float = 0.0,
        kl_estimator: str = "k3",
    ) -> None:
        super().__init__(beta, kl_estimator)
        if not epsilon_high > 0:
            raise ValueError(f"CISPOLoss: epsilon_high must be positive, got {epsilon_high}")
        if epsilon_low is not None and not 0 < epsilon_low <= 1:
            raise ValueError(f"CISPOLoss: epsilon_low must lie in (0, 1], got {epsilon_low}")
        self.epsilon_high = epsilon_high
        self.epsilon_low = epsilon_low

    def token_terms(self, policy, ratio, advantages):
        low = None if self.epsilon_low is None else 1 - self.epsilon_low
        weight = ratio.clamp(low, 1 + self.epsilon_high).detach()
        # CISPO caps the weight on either side whatever the advantage's sign.
        capped = ratio > 1 + self.epsilon_high
        if low is not None:
            capped |= ratio < low
        return -weight * advantages * policy.logps, capped


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

    reads = LossInputs(required=("advantages",), optional=("old_logps",))

    def __init__(self, epsilon: float = 3e-4, epsilon_high: float | None = 4e-4) -> None:
        self.epsilon = epsilon
        self.epsilon_high = epsilon if epsilon_high is None else epsilon_high
        check_epsilons(type(self).__name__, self.epsilon, self.epsilon_high)

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = type(self).__name__
        policy = read_policy(owner, inputs, outputs, kwargs)
        if policy.advantages.ndim != 1:
            raise ValueError(
                f"{owner} weighs whole sequences: pass one advantage per sequence (B,), "
                f"got shape {tuple(policy.advantages.shape)}"
            )
        lengths = policy.mask.sum(dim=1)
        has_tokens = lengths > 0
        ratio = torch.exp(policy.log_ratio.sum(dim=1) / lengths.clamp(min=1))
        low, high = 1 - self.epsilon, 1 + self.epsilon_high
        per_sequence = -clipped_objective(ratio, policy.advantages, low, high)
        loss = torch.where(has_tokens, per_sequence, 0).sum()
        clipped = clip_active(ratio, policy.advantages, low, high)[has_tokens]
        stats = policy_stats(policy, clipped, has_tokens.sum())
        return {"loss": loss, "num_tokens": has_tokens.sum(), "policy_stats": stats}
