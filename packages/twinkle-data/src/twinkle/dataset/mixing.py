"""Mix stored datasets: concatenate them (each scaled by a ratio) or interleave them
(drawing each next row from dataset ``i`` with probability ``ratios[i]``), seeded."""

from __future__ import annotations

import math
from collections.abc import Sequence

import datasets
import numpy as np

STRATEGIES = ("concat", "interleave")


def check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        known = ", ".join(map(repr, STRATEGIES))
        raise ValueError(f"unknown mixing strategy {strategy!r}; use one of {known}")


def check_ratios(ratios: Sequence[float] | None, count: int) -> list[float] | None:
    if ratios is None:
        return None
    ratios = list(ratios)
    if len(ratios) != count:
        raise ValueError(f"got {len(ratios)} ratios for {count} datasets; give one per dataset")
    for ratio in ratios:
        if (
            isinstance(ratio, bool)
            or not isinstance(ratio, int | float)
            or not math.isfinite(ratio)
        ):
            raise ValueError(f"ratios must be finite numbers, got {ratio!r}")
        if ratio < 0:
            raise ValueError(f"ratios must not be negative, got {ratio!r}")
    if sum(ratios) == 0:
        raise ValueError("at least one ratio must be positive")
    return [float(r) for r in ratios]


def scale(rows: datasets.Dataset, ratio: float, rng: np.random.Generator) -> datasets.Dataset:
    """``round(ratio * len(rows))`` rows: whole copies for the integer part of ``ratio``,
    then a seeded sample without replacement for the rest."""
    total = len(rows)
    wanted = round(ratio * total)
    copies, rest = divmod(wanted, total) if total else (0, 0)
    indices = np.concatenate(
        [np.tile(np.arange(total), copies), np.sort(rng.choice(total, rest, replace=False))]
    )
    return rows.select(indices.astype(np.int64))


def mix_rows(
    parts: Sequence[datasets.Dataset],
    ratios: list[float] | None,
    strategy: str,
    seed: int,
) -> datasets.Dataset:
    """The rows of ``parts`` mixed by ``strategy`` (checked by :func:`check_strategy`);
    see :meth:`Dataset.mix`."""
    if strategy == "concat":
        if ratios is not None:
            rng = np.random.default_rng(seed)
            parts = [scale(part, ratio, rng) for part, ratio in zip(parts, ratios, strict=True)]
        return datasets.concatenate_datasets(list(parts))
    probabilities = None if ratios is None else [r / sum(ratios) for r in ratios]
    return datasets.interleave_datasets(
        list(parts), probabilities=probabilities, seed=seed, stopping_strategy="first_exhausted"
    )
