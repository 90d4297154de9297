"""A metric's curve from a run's ``metrics.jsonl``, as a PNG (matplotlib, extra ``plot``)."""

from __future__ import annotations

import json
from pathlib import Path

from twinkle.utils.tracking.base import METRICS_FILE


def read_metrics(output_dir: str | Path) -> list[dict[str, float]]:
    """Every record of the run's ``metrics.jsonl``, in the order they were logged."""
    path = Path(output_dir) / METRICS_FILE
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def plot_metric(
    output_dir: str | Path, metric: str = "loss", path: str | Path | None = None
) -> Path:
    """Draw ``metric`` against the step from the run's records; returns the PNG's path
    (default: ``output_dir/<metric>_curve.png``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display on a training machine
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plot_metric needs matplotlib: pip install 'twinkle-mesh[plot]'") from exc
    points = [(r["step"], r[metric]) for r in read_metrics(output_dir) if metric in r]
    if not points:
        raise ValueError(f"no {metric!r} in {Path(output_dir) / METRICS_FILE}: nothing to plot")
    safe = metric.replace("/", "_")
    out = Path(path) if path is not None else Path(output_dir) / f"{safe}_curve.png"
    figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
    steps, values = zip(*points, strict=True)
    axes.plot(steps, values, linewidth=1.5)
    axes.set_xlabel("step")
    axes.set_ylabel(metric)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)
    return out
