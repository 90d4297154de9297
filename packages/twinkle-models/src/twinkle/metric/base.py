"""The Metric protocol and its registry.

A metric gathers numbers over many calls and reports them once:

* ``accumulate(inputs, outputs, **kwargs)`` after each forward (``inputs`` hold ``labels``
  and the other batch fields, ``outputs`` the model outputs: ``logits``, ``logps``,
  ``embeddings``), and again after each optimizer step with ``inputs = outputs = None`` and
  step-level kwargs. The model passes the same call to every metric it holds, so a metric reads
  the fields it documents, ignores a call that carries none of them, and raises when they are
  present but malformed. Accumulators stay tensors on the device: no host sync per call.
* ``calculate() -> dict[str, float]``: plain floats under fixed keys; a metric that saw
  nothing since the last reset returns ``{}``. It does not reset.
* ``reset()``: forget everything accumulated.

Conventions shared with ``twinkle.loss``: labels are not shifted (``labels[b, t]`` is the target
at position t, -100 outside the loss; the logits at t-1 predict it) and ``logps`` are aligned
with labels. Metrics are per process: under data parallelism each rank accumulates its own
share, and ``reduce_across(reduce_sum)`` (called by the model on every rank before ``calculate``)
turns the accumulators into totals over the ranks, so every rank reports the global value.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import torch

from twinkle.utils import Registry


class Metric(ABC):
    """Base class of every metric; see the module docstring for the protocol."""

    @abstractmethod
    def accumulate(
        self,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Add one call's worth of data."""

    @abstractmethod
    def calculate(self) -> dict[str, float]:
        """The values accumulated since the last reset, as plain floats."""

    @abstractmethod
    def reset(self) -> None:
        """Forget everything accumulated."""

    def reduce_across(  # noqa: B027 - a deliberate no-op default: values stay per process
        self, reduce_sum: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        """Replace the accumulators by their sums over the data-parallel ranks (``reduce_sum`` is
        a collective: every rank's metric must call it the same number of times, whatever it
        saw). Metrics whose values are already global (a gradient norm, the lr) keep theirs."""


METRICS: Registry[type[Metric]] = Registry("metric", base=Metric)


def build_metric(metric: str | type[Metric] | Metric, **kwargs: Any) -> Metric:
    """A metric from a registered name, a class (built with ``kwargs``) or an instance."""
    if isinstance(metric, Metric):
        if kwargs:
            raise ValueError(
                f"{type(metric).__name__} is already built; pass its arguments to its "
                "constructor, or pass the class or name with the arguments"
            )
        return metric
    return METRICS.get(metric)(**kwargs)
