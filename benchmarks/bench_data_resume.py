"""Cost of resuming a DataLoader at sample 9,000 of 10,000, against iterating up to it.

Resuming is index arithmetic (the consumed count fixes the epoch and the
offset; a shuffled epoch's permutation is drawn again from (seed, epoch)), so
it should cost about as much as building the loader and fetching one batch,
whatever the count. Each case times construct + ``resume_from_checkpoint`` +
the first batch at samples 1,000 and 9,000 (near-constant, not linear), and
construct + iterating from the start through sample 9,000 + the next batch,
checking that both paths reach the same batch. Prints a markdown table of
medians and exits non-zero when resuming costs more than 10% of iterating.

    .venv/bin/python benchmarks/bench_data_resume.py
"""

from __future__ import annotations

import datetime
import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

from provenance import commit

from twinkle.data_format import InputFeature
from twinkle.dataloader import DataLoader

NUM_SAMPLES = 10_000
RESUME_AT = 9_000
EARLY_RESUME_AT = 1_000
BATCH_SIZE = 8
REPEATS = 15
RATIO_LIMIT = 0.10

ROWS = [InputFeature(input_ids=[i, i + 1, i + 2]) for i in range(NUM_SAMPLES)]


def resume(make: Callable[[], DataLoader], consumed: int) -> list[InputFeature]:
    loader = make()
    loader.resume_from_checkpoint(consumed)
    return next(iter(loader))


def iterate(make: Callable[[], DataLoader]) -> list[InputFeature]:
    for step, batch in enumerate(make()):
        if step == RESUME_AT // BATCH_SIZE:
            return batch
    raise AssertionError(f"the loader never reached sample {RESUME_AT}")


def median_ms(fn: Callable[[], object]) -> float:
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> int:
    # One INFO line per resume would drown the table.
    logging.getLogger("twinkle.dataloader").setLevel(logging.WARNING)
    cases: dict[str, Callable[[], DataLoader]] = {
        "in order": lambda: DataLoader(ROWS, batch_size=BATCH_SIZE),
        "shuffled": lambda: DataLoader(ROWS, batch_size=BATCH_SIZE, shuffle=True),
    }
    print(
        f"# bench_data_resume: {datetime.date.today()}, {platform.platform()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, commit {commit()}\n"
    )
    print(
        f"{NUM_SAMPLES} samples in a list, batch_size {BATCH_SIZE}; medians of {REPEATS} runs "
        "of construct + resume + first batch, or construct + iterate + next batch.\n"
    )
    print(
        f"| case | resume at {EARLY_RESUME_AT} (ms) | resume at {RESUME_AT} (ms) "
        f"| iterate to {RESUME_AT} (ms) | resume / iterate |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    worst = 0.0
    for name, make in cases.items():
        if resume(make, RESUME_AT) != iterate(make):
            print(f"{name}: the resumed batch differs from the uninterrupted run's")
            return 1
        early = median_ms(lambda m=make: resume(m, EARLY_RESUME_AT))
        late = median_ms(lambda m=make: resume(m, RESUME_AT))
        iterated = median_ms(lambda m=make: iterate(m))
        worst = max(worst, late / iterated)
        print(f"| {name} | {early:.3f} | {late:.3f} | {iterated:.2f} | {late / iterated:.4f} |")
    verdict = "OK" if worst <= RATIO_LIMIT else "TOO SLOW"
    print(f"\nworst ratio {worst:.4f} (limit {RATIO_LIMIT}): {verdict}")
    return 0 if worst <= RATIO_LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
