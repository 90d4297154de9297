"""PolicyMetric: how far the trained policy moved from the sampler's, per RL batch.

Reads ``outputs['policy_stats']``, the detached sums every policy-gradient loss returns
(GRPO, GSPO, CISPO, SAPO, BNPO, Dr. GRPO, PPO, decoupled PPO; the model puts a loss's extra
keys into the outputs its metrics see), and the entropy of the policy at the label
positions from ``outputs['logits']`` when the model produced them. Ignores calls without
``policy_stats`` (supervised batches, step-level calls).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from twinkle.metric.base import METRICS, Metric

_SUMS = (
    "tokens",
    "ratio_sum",
    "ratio_dev_sq_sum",
    "old_kl_sum",
    "abs_log_ratio_sum",
    "clipped",
    "clip_units",
)


def label_entropy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Sum of the policy's entropy over the positions that predict a label token (the logits
    at t - 1 for a label at t), and their count."""
    mask = labels != -100
    mask[:, 0] = False
    rows, cols = mask.nonzero(as_tuple=True)
    logps = logits[rows, cols - 1].detach().float().log_softmax(-1)
    return -(logps.exp() * logps).sum(), int(rows.numel())


@METRICS.register
class PolicyMetric(Metric):
    """Reports over the RL batches since the reset:

    * ``policy/clip_fraction``: share of units (tokens; sequences for GSPO) whose clip was
      active (CISPO: whose weight was capped);
    * ``policy/ratio_mean``, ``/ratio_std``, ``/ratio_min``, ``/ratio_max``: the per-token
      importance ratio ``exp(logp - old_logp)``;
    * ``policy/kl_old``: k3 estimate of KL(sampler || policy), mean per token;
    * ``policy/logp_mismatch``: mean ``|logp - old_logp|`` over tokens; measured on the first
      pass over fresh samples it is the train/sampler numerical mismatch (reported only when
      ``old_logps`` came from a sampler);
    * ``policy/kl_ref``: the loss's KL estimate (k1, k2 or k3) to the reference policy
      (losses with ``beta > 0``);
    * ``policy/is_weight_mean``, ``/is_weight_max``, ``/is_truncated_fraction``: the
      behaviour-to-proximal importance weights of DecoupledPPOLoss (after truncation) and the
      share of tokens whose weight was truncated (that loss only);
    * ``policy/entropy``: mean entropy of the policy where it predicts label tokens (only when
      the model handed over full logits).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._sums: dict[str, torch.Tensor | float] = dict.fromkeys(_SUMS, 0.0)
        self._sampler_tokens: torch.Tensor | float = 0.0
        self._mismatch: torch.Tensor | float = 0.0
        self._ref_kl: torch.Tensor | float | None = None
        self._is_weight: torch.Tensor | float | None = None  # sum over tokens
        self._is_truncated: torch.Tensor | float = 0.0
        self._is_weight_max: torch.Tensor | None = None
        self._min: torch.Tensor | None = None
        self._max: torch.Tensor | None = None
        self._entropy: torch.Tensor | float = 0.0
        self._entropy_tokens = 0

    def accumulate(
        self,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        stats = (outputs or {}).get("policy_stats")
        if stats is None:
            return
        missing = [k for k in (*_SUMS, "ratio_min", "ratio_max") if k not in stats]
        if missing:
            raise KeyError(f"PolicyMetric: outputs['policy_stats'] lacks {missing}")
        for key in _SUMS:
            self._sums[key] = self._sums[key] + stats[key]
        if bool(stats.get("from_sampler", False)):
            self._sampler_tokens = self._sampler_tokens + stats["tokens"]
            self._mismatch = self._mismatch + stats["abs_log_ratio_sum"]
        if "ref_kl_sum" in stats:
            self._ref_kl = (self._ref_kl or 0.0) + stats["ref_kl_sum"]
        if "is_weight_sum" in stats:
            self._is_weight = (self._is_weight or 0.0) + stats["is_weight_sum"]
            self._is_truncated = self._is_truncated + stats["is_truncated"]
            top = stats["is_weight_max"]
            self._is_weight_max = (
                top if self._is_weight_max is None else torch.maximum(self._is_weight_max, top)
            )
        low, high = stats["ratio_min"], stats["ratio_max"]
        self._min = low if self._min is None else torch.minimum(self._min, low)
        self._max = high if self._max is None else torch.maximum(self._max, high)
        logits, labels = outputs.get("logits"), (inputs or {}).get("labels")
        if isinstance(logits, torch.Tensor) and isinstance(labels, torch.Tensor):
            total, count = label_entropy(logits, labels.to(logits.device))
            self._entropy = self._entropy + total
            self._entropy_tokens += count

    def reduce_across(self, reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Totals over the data-parallel ranks; ``ratio_min``/``ratio_max`` and
        ``is_weight_max`` stay this rank's."""
        local = [float(self._sums[k]) for k in _SUMS] + [
            float(self._sampler_tokens),
            float(self._mismatch),
            float(self._ref_kl or 0.0),
            float(self._ref_kl is not None),
            float(self._entropy),
            float(self._entropy_tokens),
            float(self._is_weight or 0.0),
            float(self._is_weight is not None),
            float(self._is_truncated),
        ]
        total = reduce_sum(torch.tensor(local, dtype=torch.float64)).tolist()
        self._sums = dict(zip(_SUMS, total[: len(_SUMS)], strict=True))
        sampler_tokens, mismatch, ref_kl, has_ref, entropy, entropy_tokens = total[
            len(_SUMS) : len(_SUMS) + 6
        ]
        is_weight, has_is_weight, is_truncated = total[len(_SUMS) + 6 :]
        self._sampler_tokens, self._mismatch = sampler_tokens, mismatch
        self._ref_kl = ref_kl if has_ref > 0 else None
        self._is_weight = is_weight if has_is_weight > 0 else None
        self._is_truncated = is_truncated
        self._entropy, self._entropy_tokens = entropy, int(entropy_tokens)

    def calculate(self) -> dict[str, float]:
        sums = {k: float(v) for k, v in self._sums.items()}
        if sums["tokens"] == 0:
            return {}
        tokens = sums["tokens"]
        mean = sums["ratio_sum"] / tokens
        result = {
            "policy/clip_fraction": sums["clipped"] / max(sums["clip_units"], 1.0),
            "policy/ratio_mean": mean,
            # From squared deviations around 1, where ratios sit: no cancellation.
            "policy/ratio_std": math.sqrt(
                max(sums["ratio_dev_sq_sum"] / tokens - (mean - 1) ** 2, 0.0)
            ),
            "policy/kl_old": sums["old_kl_sum"] / tokens,
        }
        if self._min is not None:  # after reduce_across, a rank that saw nothing has none
            result["policy/ratio_min"] = float(self._min)
            result["policy/ratio_max"] = float(self._max)
        if float(self._sampler_tokens) > 0:
            result["policy/logp_mismatch"] = float(self._mismatch) / float(self._sampler_tokens)
        if self._ref_kl is not None:
            result["policy/kl_ref"] = float(self._ref_kl) / tokens
        if self._is_weight is not None:
            result["policy/is_weight_mean"] = float(self._is_weight) / tokens
            result["policy/is_truncated_fraction"] = float(self._is_truncated) / tokens
            if self._is_weight_max is not None:
                result["policy/is_weight_max"] = float(self._is_weight_max)
        if self._entropy_tokens:
            result["policy/entropy"] = float(self._entropy) / self._entropy_tokens
        return result
