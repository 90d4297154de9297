"""The GRPO family beside GRPOLoss: SAPO's soft gate, and BNPO's and Dr. GRPO's
normalisations of GRPO's clipped token terms.

All read what GRPOLoss reads (``twinkle.loss.rl``) and add ``beta`` times the reference KL
estimate per token the same way. DAPO needs no class of its own: GRPOLoss already uses its
token-level normalisation, ``epsilon_high`` is its asymmetric clip, and overlong filtering
and dynamic sampling act on rollouts (``twinkle.advantage.dapo``).
"""

from __future__ import annotations

import torch

from twinkle.loss.policy_inputs import PolicyInputs
from twinkle.loss.registry import LOSSES
from twinkle.loss.rl import GRPOLoss, TokenPolicyLoss


@LOSSES.register
class SAPOLoss(TokenPolicyLoss):
    """Soft Adaptive Policy Optimisation: a smooth gate in place of the hard clip.

    For each label token with ``r_t = exp(logp_t - old_logp_t)`` and advantage ``A``::

        tau = tau_pos if A > 0 else tau_neg
        l_t = -(4 / tau) * sigmoid(tau * (r_t - 1)) * A + beta * KL_t

    The gate's slope ``4 sigmoid(1 - sigmoid)`` is 1 at ``r = 1`` (so on-policy the
    gradient is GRPO's) and decays smoothly as the ratio leaves 1, faster for larger
    ``tau``; negative advantages get the larger temperature by default, damping them more.
    Normalised by label tokens. ``policy_stats``' clipped units are the tokens whose
    gradient the gate damps by more than half.
    """

    def __init__(
        self,
        tau_pos: float = 1.0,
        tau_neg: float = 1.05,
        beta: float = 0.0,
        kl_estimator: str = "k3",
    ) -> None:
        super().__init__(beta, kl_estimator)
        for name, tau in (("tau_pos", tau_pos), ("tau_neg", tau_neg)):
            if not 0 < tau < float("inf"):
                raise ValueError(f"SAPOLoss: {name} must be a positive finite number, got {tau}")
        self.tau_pos, self.tau_neg = tau_pos, tau_neg

    def token_terms(self, policy, ratio, advantages):
        pos, neg = (torch.tensor(t, dtype=ratio.dtype) for t in (self.tau_pos, self.tau_neg))
        tau = torch.where(advantages > 0, pos.to(ratio.device), neg.to(ratio.device))
        gate = torch.sigmoid(tau * (ratio - 1))
        damped = (4 * gate * (1 - gate)).detach() < 0.5
        return -(4 / tau) * gate * advantages, damped


@LOSSES.register
class BNPOLoss(GRPOLoss):
    """GRPO's clipped token terms normalised by the label tokens of each batch a loss call
    sees, not of the whole optimizer step: ``loss = sum_t l_t / tokens of this batch``,
    ``num_tokens`` = 1. One batch per step trains exactly as GRPOLoss; under gradient
    accumulation (or ``micro_batch_size``) every batch weighs the same whatever its length,
    as in the batch-normalised loss of TRL and ms-swift. Under data parallel the batch a
    call sees is the rank's share (TRL's local batch): DDP trains as one process running
    the shares as micro-batches, not as one process on the whole batch."""

    def reduce(self, policy: PolicyInputs, per_token: torch.Tensor):
        total = torch.where(policy.mask, per_token, 0).sum()
        return total / policy.num_tokens, torch.ones_like(policy.num_tokens)


@LOSSES.register
class DRGRPOLoss(GRPOLoss):
    """Dr. GRPO: GRPO's clipped token terms over a constant normaliser, ``num_tokens = rows
    * max_completion_length``, so neither a completion's length nor the batch's mix of
    lengths rescales its tokens' gradient (pair it with ``GRPOAdvantage(...,
    scale='none')``, the unscaled advantage of the same paper). Every row counts, with or
    without label tokens; a row with more than ``max_completion_length`` label tokens is an
    error, since the constant would no longer bound the sum."""

    def __init__(
        self,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        kl_estimator: str = "k3",
        max_completion_length: int = 1024,
    ) -> None:
        super().__init__(epsilon, epsilon_high, beta, kl_estimator)
        if isinstance(max_completion_length, bool) or not isinstance(max_completion_length, int):
            raise TypeError(
                f"DRGRPOLoss: max_completion_length must be an int, got {max_completion_length!r}"
            )
        if max_completion_length < 1:
            raise ValueError(
                f"DRGRPOLoss: max_completion_length must be >= 1, got {max_completion_length}"
            )
        self.max_completion_length = max_completion_length

    def reduce(self, policy: PolicyInputs, per_token: torch.Tensor):
        lengths = policy.mask.sum(dim=1)
        longest = int(lengths.max())
        if longest > self.max_completion_length:
            row = int(lengths.argmax())
            raise ValueError(
                f"DRGRPOLoss: row {row} has {longest} label tokens, more than "
                f"max_completion_length={self.max_completion_length}; set it to the sampler's "
                f"max_tokens"
            )
        rows = policy.labels.shape[0]
        normaliser = torch.tensor(rows * self.max_completion_length, device=lengths.device)
        return torch.where(policy.mask, per_token, 0).sum(), normaliser
