"""Packing for padding-free training: how full the packed rows are, and how long packing
takes, on 10,000 encoded rows of skewed length packed into rows of 2,048 tokens.

The lengths are log-normal (median 300 tokens, sigma 1, clipped to 8..2048, seed 0): many
short conversations and a long tail, as chat SFT data tends to be. Efficiency is non-pad
tokens over capacity, ``sum(lengths) / (packed rows * 2048)``. Times are medians of
several runs after a warm-up: planning alone (``pack_lengths``), and
``PackingDataset(dataset=encoded, max_length=2048)`` end to end (plan, concatenate the
Arrow columns, wrap them as a dataset). Prints a markdown table and exits non-zero when a
target is missed.

    .venv/bin/python benchmarks/bench_data_packing.py
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import datasets
import numpy as np
import pyarrow as pa
from provenance import commit

from twinkle.dataset import Dataset, PackingDataset, pack_lengths, packing_efficiency
from twinkle.utils import get_logger

ROWS = 10_000
MAX_LENGTH = 2048
REPEATS = 7
EFFICIENCY_TARGET = 0.995
SECONDS_TARGET = 1.0


def skewed_lengths(rows: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(300), 1.0, rows).astype(np.int64), 8, MAX_LENGTH)


def encoded_dataset(lengths: np.ndarray) -> Dataset:
    """An encoded Dataset of rows with these lengths (random int32 ids as encode stores them,
    the first half of each row masked as a prompt), built directly in Arrow: tokenizing
    millions of tokens first would only time the tokenizer."""
    rng = np.random.default_rng(1)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    total = int(lengths.sum())
    input_ids = rng.integers(0, 32_000, total, dtype=np.int32)
    starts = (np.cumsum(lengths) - lengths).astype(np.int32)
    positions = np.arange(total, dtype=np.int32) - np.repeat(starts, lengths)
    labels = np.where(positions < np.repeat(lengths // 2, lengths), -100, input_ids).astype(
        np.int32
    )
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(offsets, pa.array(input_ids)),
            "labels": pa.ListArray.from_arrays(offsets, pa.array(labels)),
            "position_ids": pa.ListArray.from_arrays(offsets, pa.array(positions)),
            "length": pa.array(lengths),
        }
    )
    return Dataset._from_rows(datasets.Dataset(table), "synthetic", "encoded", None)


def median_seconds(run: Callable[[], object]) -> float:
    run()  # warm-up
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    get_logger("twinkle").setLevel("WARNING")  # one "packed ..." line per run is noise here
    datasets.disable_progress_bars()
    lengths = skewed_lengths(ROWS)
    bins = pack_lengths(lengths, MAX_LENGTH)
    efficiency = packing_efficiency(lengths, bins, MAX_LENGTH)
    lower_bound = int(np.ceil(lengths.sum() / MAX_LENGTH))
    base = encoded_dataset(lengths)
    plan = median_seconds(lambda: pack_lengths(lengths, MAX_LENGTH))
    end_to_end = median_seconds(lambda: PackingDataset(dataset=base, max_length=MAX_LENGTH))

    print(
        f"# bench_data_packing: {datetime.date.today()}, {platform.platform()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, commit {commit()}\n"
    )
    print(
        f"{ROWS} rows, {int(lengths.sum())} tokens (median {int(np.median(lengths))}, "
        f"max {int(lengths.max())}), max_length {MAX_LENGTH}; times are medians of "
        f"{REPEATS} runs.\n"
    )
    results = [
        (
            "packing efficiency",
            f"{100 * efficiency:.2f}%",
            f">= {100 * EFFICIENCY_TARGET}%",
            efficiency >= EFFICIENCY_TARGET,
        ),
        ("packed rows (lower bound)", f"{len(bins)} ({lower_bound})", "", None),
        ("plan: pack_lengths", f"{1000 * plan:.1f} ms", "", None),
        (
            "PackingDataset end to end",
            f"{1000 * end_to_end:.1f} ms",
            f"< {SECONDS_TARGET * 1000:.0f} ms",
            end_to_end < SECONDS_TARGET,
        ),
    ]
    print("| measure | value | target | |")
    print("| --- | ---: | ---: | --- |")
    for name, value, target, ok in results:
        verdict = "" if ok is None else "OK" if ok else "MISSED"
        print(f"| {name} | {value} | {target} | {verdict} |")
    missed = [name for name, _, _, ok in results if ok is False]
    print(f"\n{'targets missed: ' + ', '.join(missed) if missed else 'all targets met'}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
