"""ScalarMetric: one named training number (grad_norm, lr, ...) reduced over the calls."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch

from twinkle.metric._values import scalar
from twinkle.metric.base import METRICS, Metric

Reduction = Literal["mean", "last", "min", "max"]
_REDUCE: dict[str, Callable[[list[float]], float]] = {
    "mean": statistics.fmean,
    "last": lambda values: values[-1],
    "min": min,
    "max": max,
}


@METRICS.register
class ScalarMetric(Metric):
    """Records ``kwargs[key]`` whenever a call carries it and reports ``{name: reduced}``.

    ``ScalarMetric('grad_norm')`` gives the mean gradient norm over the steps since the reset;
    ``ScalarMetric('lr', reduction='last')`` the current learning rate. ``name`` defaults to
    ``key``. Tensor values stay on their device until ``calculate``; a non-finite value (an
    overflowed grad norm) is reported as it is, not hidden.
    """

    def __init__(self, key: str, reduction: Reduction = "mean", name: str | None = None) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"ScalarMetric needs the kwarg name to record, got {key!r}")
        if reduction not in _REDUCE:
            raise ValueError(f"reduction must be one of {', '.join(_REDUCE)}, got {reduction!r}")
        self.key = key
        self.reduction = reduction
        self.name = key if name is None else name
        self.reset()

    def reset(self) -> None:
        self._values: list[torch.Tensor | float] = []

    def accumulate(
        self,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        value = kwargs.get(self.key)
        if value is not None:
            self._values.append(scalar(value, self.key))

    def calculate(self) -> dict[str, float]:
        if not self._values:
            return {}
        return {self.name: _REDUCE[self.reduction]([float(v) for v in self._values])}
