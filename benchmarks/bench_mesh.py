"""Cost of the remote decorators in local mode, against plain classes.

A ``@remote_function`` method must cost what a plain method costs (the
decorator returns the same function); ``@remote_class`` adds one wrapper call
to construction. Prints a markdown table of medians and exits non-zero when a
marked call is more than 1.2× a plain call.

    .venv/bin/python benchmarks/bench_mesh.py
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import timeit

from provenance import commit

from twinkle import remote_class, remote_function

CALL_RATIO_LIMIT = 1.2
REPEATS = 101
CALLS = 100_000
CONSTRUCTIONS = 30_000


class Plain:
    def __init__(self, scale: int = 2) -> None:
        self.scale = scale

    def step(self, batch: list[int]) -> int:
        return len(batch) * self.scale


@remote_class(execute="all")
class Remote:
    def __init__(self, scale: int = 2) -> None:
        self.scale = scale

    @remote_function(dispatch="slice_dp", collect="mean")
    def step(self, batch: list[int]) -> int:
        return len(batch) * self.scale


def medians_ns(cases: dict[str, tuple[str, int]], namespace: dict) -> dict[str, float]:
    """Median nanoseconds per operation; cases are interleaved so drift hits all alike."""
    timers = {name: timeit.Timer(stmt, globals=namespace) for name, (stmt, _) in cases.items()}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(REPEATS):
        for name, (_, number) in cases.items():
            samples[name].append(timers[name].timeit(number) / number * 1e9)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> int:
    namespace = {"Plain": Plain, "Remote": Remote, "batch": [1, 2, 3, 4]}
    namespace["plain"], namespace["remote"] = Plain(), Remote()
    calls = medians_ns(
        {
            "plain method call": ("plain.step(batch)", CALLS),
            "@remote_function method call": ("remote.step(batch)", CALLS),
        },
        namespace,
    )
    constructions = medians_ns(
        {
            "plain construction": ("Plain(3)", CONSTRUCTIONS),
            "@remote_class construction": ("Remote(3)", CONSTRUCTIONS),
            "@remote_class construction, remote_group=": (
                "Remote(3, remote_group='model')",
                CONSTRUCTIONS,
            ),
        },
        namespace,
    )
    call_ratio = calls["@remote_function method call"] / calls["plain method call"]
    print(
        f"# bench_mesh: {datetime.date.today()}, {platform.platform()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, commit {commit()}\n"
    )
    print(f"Medians of {REPEATS} interleaved repeats.\n")
    print("| case | median ns/op | ratio to plain |")
    print("| --- | ---: | ---: |")
    for table, baseline in ((calls, "plain method call"), (constructions, "plain construction")):
        for name, ns in table.items():
            print(f"| {name} | {ns:.1f} | {ns / table[baseline]:.2f}× |")
    verdict = "OK" if call_ratio <= CALL_RATIO_LIMIT else "TOO SLOW"
    print(f"\ncall ratio {call_ratio:.3f} (limit {CALL_RATIO_LIMIT}): {verdict}")
    return 0 if call_ratio <= CALL_RATIO_LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
