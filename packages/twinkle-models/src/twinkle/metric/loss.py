"""LossMetric: the token-weighted mean loss over every micro-batch since the last reset."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.metric._values import scalar
from twinkle.metric.base import METRICS, Metric


@METRICS.register
class LossMetric(Metric):
    """``loss = sum(loss sums) / sum(num_tokens)`` over the accumulated calls.

    Reads the kwargs ``loss`` (the SUM a ``twinkle.loss`` returns) and ``num_tokens`` (the
    normaliser it returns), so ``metric.accumulate(inputs, outputs, **loss_fn(inputs, outputs))``
    feeds it. Dividing the totals once, rather than averaging per-batch means, weights each
    micro-batch by its tokens, exactly as the gradient does. Reports ``{'loss': float}``.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._loss_sum: torch.Tensor | float = 0.0
        self._num_tokens: torch.Tensor | float = 0.0
        self._seen = False

    def accumulate(
        self,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        loss, num_tokens = kwargs.get("loss"), kwargs.get("num_tokens")
        if loss is None and num_tokens is None:
            return
        if loss is None or num_tokens is None:
            missing = "loss" if loss is None else "num_tokens"
            raise ValueError(
                f"LossMetric needs both loss (the summed loss) and num_tokens (its normaliser); "
                f"{missing} is missing"
            )
        self._loss_sum = self._loss_sum + scalar(loss, "loss")
        self._num_tokens = self._num_tokens + scalar(num_tokens, "num_tokens")
        self._seen = True

    def reduce_across(self, reduce_sum) -> None:
        local = [float(self._loss_sum), float(self._num_tokens), float(self._seen)]
        loss_sum, num_tokens, seen = reduce_sum(torch.tensor(local, dtype=torch.float64)).tolist()
        self._loss_sum, self._num_tokens, self._seen = loss_sum, num_tokens, seen > 0

    def calculate(self) -> dict[str, float]:
        if not self._seen:
            return {}
        num_tokens = float(self._num_tokens)
        if num_tokens <= 0:
            raise ValueError(
                f"LossMetric: the accumulated batches count {num_tokens} tokens, so the mean loss "
                "is undefined; a batch needs label tokens (labels != -100)"
            )
        return {"loss": float(self._loss_sum) / num_tokens}
