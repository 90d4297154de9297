"""``create_tracker``: backends by name, the extra each needs, and the errors for others."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path

from twinkle.utils.tracking import backends
from twinkle.utils.tracking.base import GuardedTracker, JsonlTracker, MultiTracker, Tracker

# name -> (class, the module it imports, the extra of twinkle-mesh that installs it)
BACKENDS: dict[str, tuple[type[Tracker], str, str]] = {
    "tensorboard": (backends.TensorBoardTracker, "tensorboard", "tensorboard"),
    "wandb": (backends.WandbTracker, "wandb", "wandb"),
    "mlflow": (backends.MlflowTracker, "mlflow", "mlflow"),
    "swanlab": (backends.SwanlabTracker, "swanlab", "swanlab"),
}
NONE = "none"


def _names(report_to: str | Sequence[str] | None) -> list[str]:
    names = [report_to] if isinstance(report_to, str) or report_to is None else list(report_to)
    names = [NONE if n is None else str(n).strip().lower() for n in names]
    known = [NONE, *BACKENDS]
    unknown = [n for n in names if n not in known]
    if unknown:
        extras = ", ".join(f"{n} (pip install 'twinkle-mesh[{BACKENDS[n][2]}]')" for n in BACKENDS)
        raise ValueError(f"unknown tracker {unknown[0]!r}; known: none, {extras}")
    if NONE in names and len(names) > 1:
        raise ValueError(f"report_to {names}: 'none' cannot be combined with other trackers")
    return [n for n in names if n != NONE]


def _check_installed(name: str) -> None:
    _, module, extra = BACKENDS[name]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"the {name!r} tracker needs the {module} package: pip install 'twinkle-mesh[{extra}]' "
            f"(or pip install {module})"
        ) from exc


def create_tracker(
    report_to: str | Sequence[str] | None,
    *,
    output_dir: str | Path,
    project: str = "twinkle",
    run_name: str = "run",
) -> Tracker:
    """The trackers named in ``report_to`` (``"none"``, one name or several), plus the
    ``metrics.jsonl`` record in ``output_dir`` that every run keeps.

    A name that is not a backend, or a backend whose package is missing, fails here, before
    any training; a backend that fails later (its service down) warns once and is dropped.
    """
    names = _names(report_to)
    for name in names:
        _check_installed(name)
    trackers: list[Tracker] = [JsonlTracker(output_dir)]
    for name in names:
        guarded = GuardedTracker(_Lazy(name, Path(output_dir), project, run_name))
        trackers.append(guarded)
    return MultiTracker(trackers)


class _Lazy(Tracker):
    """Starts the backend's run on first use, inside the guard: a service that cannot be
    reached at start-up warns like one that fails later."""

    def __init__(self, name: str, output_dir: Path, project: str, run_name: str) -> None:
        self.name = name
        self._args = (output_dir, project, run_name)
        self._tracker: Tracker | None = None

    def _started(self) -> Tracker:
        if self._tracker is None:
            self._tracker = BACKENDS[self.name][0](*self._args)
        return self._tracker

    def log(self, metrics, step: int) -> None:
        self._started().log(metrics, step)

    def log_config(self, config) -> None:
        self._started().log_config(config)

    def close(self) -> None:
        if self._tracker is not None:
            self._tracker.close()
