"""MetricCollection: several metrics behind one Metric, as a model holds them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from twinkle.metric.base import Metric


class MetricCollection(Metric):
    """Passes each call to every metric and merges their reports into one dict, with
    ``prefix`` in front of every key (``'eval/'`` -> ``'eval/loss'``). Two metrics reporting
    the same key is an error, never a silent overwrite. ``calculate_and_reset`` is what a
    model's ``calculate_metric`` returns: the report, then a clean slate."""

    def __init__(self, metrics: Iterable[Metric] = (), prefix: str = "") -> None:
        self.prefix = prefix
        self._metrics: list[Metric] = []
        for metric in metrics:
            self.add(metric)

    def add(self, metric: Metric) -> None:
        if not isinstance(metric, Metric):
            raise TypeError(f"a MetricCollection holds Metric instances, got {metric!r}")
        if any(metric is held for held in self._metrics):
            raise ValueError(f"this {type(metric).__name__} instance is already in the collection")
        self._metrics.append(metric)

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._metrics)

    def __len__(self) -> int:
        return len(self._metrics)

    def accumulate(
        self,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        for metric in self._metrics:
            metric.accumulate(inputs, outputs, **kwargs)

    def calculate(self) -> dict[str, float]:
        merged: dict[str, float] = {}
        source: dict[str, str] = {}
        for metric in self._metrics:
            for key, value in metric.calculate().items():
                name = type(metric).__name__
                if key in merged:
                    raise ValueError(
                        f"{name} and {source[key]} both report {key!r}; remove one of them or "
                        "give one a distinct name"
                    )
                merged[key] = value
                source[key] = name
        return {self.prefix + key: value for key, value in merged.items()}

    def reset(self) -> None:
        for metric in self._metrics:
            metric.reset()

    def reduce_across(self, reduce_sum) -> None:
        for metric in self._metrics:
            metric.reduce_across(reduce_sum)

    def calculate_and_reset(self) -> dict[str, float]:
        result = self.calculate()
        self.reset()
        return result
