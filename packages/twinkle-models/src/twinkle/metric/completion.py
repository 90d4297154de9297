"""CompletionRewardMetric: reward and completion-length statistics of RL rollouts.

Not fed by the model: the RL loop calls it with what the sampler and rewards produced.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from twinkle.metric._values import counts, finite_floats
from twinkle.metric.base import METRICS, Metric


@METRICS.register
class CompletionRewardMetric(Metric):
    """Reads the kwargs ``completion_lengths`` (one int per completion) and ``rewards`` (a dict
    from reward name to one number per completion), as the RL examples call it::

        metrics.accumulate(completion_lengths=lengths, rewards={'total': [...], 'format': [...]})
        metrics.accumulate(None, None, completion_lengths=lengths, rewards=rewards)

    Every list of one call has the same length. ``calculate`` reports over all completions
    since the reset, for each reward name: ``reward/{name}/mean``, ``/std`` (population),
    ``/min``, ``/max``; and ``completion_length/mean``, ``/min``, ``/max``.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._lengths: list[int] = []
        self._rewards: dict[str, list[float]] = {}

    def accumulate(
        self,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        raw_lengths, raw_rewards = kwargs.get("completion_lengths"), kwargs.get("rewards")
        if raw_lengths is None and raw_rewards is None:
            return
        sizes: dict[str, int] = {}
        lengths: list[int] = []
        if raw_lengths is not None:
            lengths = counts(raw_lengths, "completion_lengths")
            sizes["completion_lengths"] = len(lengths)
        rewards: dict[str, list[float]] = {}
        if raw_rewards is not None:
            if not isinstance(raw_rewards, Mapping):
                raise TypeError(
                    "rewards must be a dict from reward name to one number per completion, "
                    f"e.g. {{'total': [...]}}; got {type(raw_rewards).__name__}"
                )
            for name, values in raw_rewards.items():
                if not isinstance(name, str) or not name:
                    raise TypeError(f"reward names must be non-empty strings, got {name!r}")
                rewards[name] = finite_floats(values, f"rewards[{name!r}]")
                sizes[f"rewards[{name!r}]"] = len(rewards[name])
        if len(set(sizes.values())) > 1:
            listed = ", ".join(f"{key}: {size}" for key, size in sizes.items())
            raise ValueError(f"give one value per completion everywhere; lengths differ ({listed})")
        self._lengths.extend(lengths)
        for name, values in rewards.items():
            self._rewards.setdefault(name, []).extend(values)

    def calculate(self) -> dict[str, float]:
        result: dict[str, float] = {}
        for name, values in self._rewards.items():
            if values:
                result.update(_stats(f"reward/{name}", values, with_std=True))
        if self._lengths:
            result.update(_stats("completion_length", self._lengths, with_std=False))
        return result


def _stats(prefix: str, values: list[float] | list[int], with_std: bool) -> dict[str, float]:
    stats = {
        f"{prefix}/mean": statistics.fmean(values),
        f"{prefix}/min": float(min(values)),
        f"{prefix}/max": float(max(values)),
    }
    if with_std:
        stats[f"{prefix}/std"] = statistics.pstdev(values)
    return stats
