"""Metrics that total a loss's detached statistics: the loss returns a dict of sums under
one key (``preference_stats``, ``value_stats``, ``distill_stats``), the model puts it in
the outputs its metrics see, and the metric adds them up and divides once at the end, so
every micro-batch and rank is weighted by its units, as the gradient is."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from twinkle.metric.base import Metric


class StatSumsMetric(Metric):
    """Sums ``outputs[stats_key][field]`` for each of ``fields`` over the calls; a call
    without ``stats_key`` is ignored. Subclasses turn the totals into figures in
    ``figures``; ``count_field`` says which total means "nothing seen" when zero."""

    stats_key: ClassVar[str]
    fields: ClassVar[tuple[str, ...]]
    count_field: ClassVar[str]

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._totals: dict[str, torch.Tensor | float] = dict.fromkeys(self.fields, 0.0)

    def accumulate(
        self,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        stats = (outputs or {}).get(self.stats_key)
        if stats is None:
            return
        missing = [k for k in self.fields if k not in stats]
        if missing:
            raise KeyError(f"{type(self).__name__}: outputs[{self.stats_key!r}] lacks {missing}")
        for key in self.fields:
            self._totals[key] = self._totals[key] + stats[key].detach()

    def reduce_across(self, reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> None:
        local = torch.tensor([float(self._totals[k]) for k in self.fields], dtype=torch.float64)
        self._totals = dict(zip(self.fields, reduce_sum(local).tolist(), strict=True))

    def calculate(self) -> dict[str, float]:
        totals = {k: float(v) for k, v in self._totals.items()}
        if totals[self.count_field] == 0:
            return {}
        return self.figures(totals)

    @abstractmethod
    def figures(self, totals: dict[str, float]) -> dict[str, float]:
        """The metric's figures from the totals (``count_field``'s is not zero)."""
