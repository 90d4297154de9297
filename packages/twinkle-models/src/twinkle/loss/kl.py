"""Per-token estimators of KL(policy || reference) from tokens the policy sampled.

With ``d = logp - ref_logp`` at each sampled token (Schulman's notation):

* ``k1 = d``: unbiased, high variance, negative on some tokens;
* ``k2 = d ** 2 / 2``: biased, low variance, always >= 0; its gradient is that of the
  reverse KL for on-policy samples;
* ``k3 = exp(-d) - 1 + d``: unbiased and always >= 0 (the GRPO paper's choice).
"""

from __future__ import annotations

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")


def check_kl_estimator(owner: str, estimator: str) -> str:
    if estimator not in KL_ESTIMATORS:
        raise ValueError(
            f"{owner}: kl_estimator must be one of {', '.join(KL_ESTIMATORS)}, got {estimator!r}"
        )
    return estimator


def kl_estimate(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str) -> torch.Tensor:
    """The chosen estimator at every position (callers mask the label tokens)."""
    d = logps - ref_logps
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d.square()
    return torch.expm1(-d) + d
