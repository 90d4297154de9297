"""ThroughputMetric: tokens processed, seconds per optimizer step, and tokens per second."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from twinkle.metric._values import scalar
from twinkle.metric.base import METRICS, Metric


@METRICS.register
class ThroughputMetric(Metric):
    """Fed by the model with two kwargs, each optional per call:

    * ``input_tokens``: tokens the forward processed (non-padding; a packed row counts its
      real tokens), once per forward;
    * ``step_time``: wall seconds of one optimizer step, from its first forward to the end of
      the update, once per optimizer step.

    Reports ``tokens`` (the sum), ``step_time`` (mean seconds per step) and
    ``tokens_per_second`` (tokens / total step seconds), each only when its inputs were seen.
    Call ``calculate`` at a step boundary: tokens of a half-done step would count against the
    time of the finished ones.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._tokens: torch.Tensor | float = 0.0
        self._seconds = 0.0
        self._steps = 0
        self._seen_tokens = False

    def accumulate(
        self,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        tokens, step_time = kwargs.get("input_tokens"), kwargs.get("step_time")
        if tokens is not None:
            tokens = scalar(tokens, "input_tokens")
            if isinstance(tokens, float) and tokens < 0:
                raise ValueError(f"input_tokens must be >= 0, got {tokens}")
            self._tokens = self._tokens + tokens
            self._seen_tokens = True
        if step_time is not None:
            seconds = float(scalar(step_time, "step_time"))
            if not math.isfinite(seconds) or seconds < 0:
                raise ValueError(f"step_time must be finite seconds >= 0, got {seconds}")
            self._seconds += seconds
            self._steps += 1

    def reduce_across(self, reduce_sum) -> None:
        """Tokens are summed over the ranks; step times stay this rank's (the ranks step
        together), so tokens_per_second is the whole job's."""
        local = torch.tensor([float(self._tokens), float(self._seen_tokens)], dtype=torch.float64)
        tokens, seen = reduce_sum(local).tolist()
        self._tokens, self._seen_tokens = tokens, seen > 0

    def calculate(self) -> dict[str, float]:
        result: dict[str, float] = {}
        if self._seen_tokens:
            result["tokens"] = float(self._tokens)
        if self._steps:
            result["step_time"] = self._seconds / self._steps
            if self._seen_tokens and self._seconds > 0:
                result["tokens_per_second"] = result["tokens"] / self._seconds
        return result
