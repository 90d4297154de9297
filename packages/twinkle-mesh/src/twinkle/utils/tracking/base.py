"""The tracker interface, the JSON-lines record every run keeps, and the guard that lets a
failing backend warn once instead of stopping the training."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from numbers import Real
from pathlib import Path
from typing import Any

from twinkle.utils.logger import get_logger

logger = get_logger(__name__)

METRICS_FILE = "metrics.jsonl"


class Tracker:
    """Receives a loop's metrics. Subclasses override ``log`` and, when they hold a run or a
    file, ``close``; ``log_config`` records the run's settings once at the start."""

    name = "none"

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record the numbers of ``metrics`` at ``step``; other values are skipped."""

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Record the run's settings (flags, hyperparameters)."""

    def close(self) -> None:
        """Flush and end the run."""

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite real numbers of ``metrics`` (bools and strings are not curves)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, Real) and not isinstance(value, bool):
            value = float(value)
            if math.isfinite(value):
                out[str(key)] = value
        elif hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy/torch 0-d
            out.update(scalars({key: value.item()}))
    return out


class JsonlTracker(Tracker):
    """One JSON object per ``log`` call in ``output_dir/metrics.jsonl``: the record that needs
    no extra package, and what ``plot_metric`` reads."""

    name = "jsonl"

    def __init__(self, output_dir: str | Path) -> None:
        path = Path(output_dir)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / METRICS_FILE
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self._file.write(json.dumps({"step": int(step), **scalars(metrics)}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class GuardedTracker(Tracker):
    """Wraps a backend: its first failure is logged as a warning and the backend is dropped,
    so a tracking service that is down never stops a training run."""

    def __init__(self, inner: Tracker) -> None:
        self.inner: Tracker | None = inner
        self.name = inner.name

    def _call(self, method: str, *args: Any) -> None:
        if self.inner is None:
            return
        try:
            getattr(self.inner, method)(*args)
        except Exception as exc:  # any failure of a tracker must not stop training
            logger.warning(
                f"tracker {self.name!r} failed in {method} ({type(exc).__name__}: {exc}); "
                "it is switched off for the rest of this run, training goes on"
            )
            self.inner = None

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self._call("log", metrics, step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._call("log_config", config)

    def close(self) -> None:
        self._call("close")


class MultiTracker(Tracker):
    """Several trackers as one."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers
        self.name = "+".join(t.name for t in trackers)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for tracker in self.trackers:
            tracker.log(metrics, step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        for tracker in self.trackers:
            tracker.log_config(config)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
