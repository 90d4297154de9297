"""Encode throughput of twinkle.template against a plain apply_chat_template loop.

The baseline is what a user writes without Twinkle: one
``tokenizer.apply_chat_template(messages, return_assistant_tokens_mask=True)`` per row,
labels taken from the mask of the template's ``{% generation %}`` blocks (the bundled
tiny-qwen3 template has them). Twinkle is ``Qwen3_5Template.batch_encode`` over chunks of
1,000 rows in one process, and ``Dataset.encode(num_proc=2)`` for two processes, which is
set against the same baseline loop run by ``datasets.map(num_proc=2)``. Target: twinkle
at least 0.8x the baseline, with exactly the baseline's labels.

Two sets: the bundled self-cognition rows (placeholders filled, repeated to
``--self-cognition-rows``) and a synthetic multi-turn set generated from a seed (1-3
turns, every other row with a system prompt). Prints a markdown table of medians over
``--runs`` interleaved runs, in rows per wall-clock second and in rows per CPU-second
(this process plus its worker processes). The verdict uses CPU time: on a shared VM the
wall clock also measures the neighbours. Exits 1 when any label differs from the
baseline's.

    .venv/bin/python benchmarks/bench_data_encode.py [--runs 3] [--rows 10000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

# Forked workers would switch the tokenizer's thread pool off with a warning; keep both
# sides at one thread per process so the comparison is like for like.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import transformers  # noqa: E402
from provenance import commit

from twinkle.dataset import Dataset, DatasetMeta  # noqa: E402
from twinkle.hub import resolve_dataset  # noqa: E402
from twinkle.template import Qwen3_5Template  # noqa: E402

MODEL_ID = "bundled://tiny-qwen3"
CHUNK = 1000
TARGET = 0.8
BASELINE_1 = "baseline, 1 process"
BASELINE_2 = "baseline datasets.map, num_proc=2"
TEXT = (
    "the model learns to answer questions about data training tokens and labels quickly "
    "with a small batch on one device while the loss goes down step by step 模型 训练 数据"
)
WORDS = TEXT.split()

Rows = list[dict[str, Any]]
Pairs = list[tuple[list[int], list[int]]]
"""Per row: input_ids and labels, as lists, to compare the ways exactly."""
Clock = tuple[float, float]
"""Wall-clock seconds and CPU seconds (this process and its reaped children)."""


def self_cognition_rows(count: int) -> Rows:
    """The bundled self-cognition set as conversations, repeated to ``count`` rows."""

    def fill(text: str) -> str:
        return text.replace("{{NAME}}", "Twinkle").replace("{{AUTHOR}}", "ModelScope")

    path = resolve_dataset("bundled://self-cognition") / "train.jsonl"
    base = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        base.append(
            {
                "messages": [
                    {"role": "user", "content": fill(row["query"])},
                    {"role": "assistant", "content": fill(row["response"])},
                ]
            }
        )
    return [base[i % len(base)] for i in range(count)]


def synthetic_rows(count: int, seed: int = 0) -> Rows:
    """``count`` conversations of 1-3 turns; even rows have a system prompt."""
    rng = random.Random(seed)

    def sentence(low: int, high: int) -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(low, high))).capitalize() + "."

    rows = []
    for i in range(count):
        messages = [{"role": "system", "content": sentence(3, 10)}] if i % 2 == 0 else []
        for _ in range(rng.randint(1, 3)):
            messages.append({"role": "user", "content": sentence(3, 15)})
            messages.append({"role": "assistant", "content": sentence(5, 30)})
        rows.append({"messages": messages})
    return rows


def baseline_encode(tokenizer: Any, rows: Rows) -> Pairs:
    """The loop a user writes: apply_chat_template per row, labels from its mask."""
    out = []
    for row in rows:
        encoded = tokenizer.apply_chat_template(
            row["messages"], return_dict=True, return_assistant_tokens_mask=True
        )
        ids = encoded["input_ids"]
        mask = encoded["assistant_masks"]
        out.append((ids, [t if m else -100 for t, m in zip(ids, mask, strict=True)]))
    return out


class BaselineMap:
    """The baseline loop as a ``datasets.map`` function (picklable for num_proc)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        rows = [{"messages": messages} for messages in batch["messages"]]
        pairs = baseline_encode(self.tokenizer, rows)
        return {"input_ids": [p[0] for p in pairs], "labels": [p[1] for p in pairs]}


def clock() -> Clock:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), time.process_time() + children.ru_utime + children.ru_stime


def since(start: Clock) -> Clock:
    now = clock()
    return now[0] - start[0], now[1] - start[1]


def timed(run: Callable[[], Any]) -> tuple[Clock, Any]:
    start = clock()
    result = run()
    return since(start), result


def twinkle_encode(template: Qwen3_5Template, rows: Rows) -> tuple[Clock, list]:
    def encode() -> list:
        features = []
        for start in range(0, len(rows), CHUNK):
            features += template.batch_encode(rows[start : start + CHUNK])
        return features

    return timed(encode)


def baseline_map(tokenizer: Any, rows: Rows, num_proc: int) -> tuple[Clock, datasets.Dataset]:
    table = datasets.Dataset.from_list(rows)
    return timed(
        lambda: table.map(
            BaselineMap(tokenizer),
            batched=True,
            batch_size=CHUNK,
            num_proc=num_proc,
            remove_columns=table.column_names,
            load_from_cache_file=False,
        )
    )


def dataset_encode(name: str, rows: Rows, num_proc: int) -> tuple[Clock, Dataset]:
    """Twinkle's Dataset pipeline, timing ``encode`` alone (the rest prepares its input)."""
    dataset = Dataset(DatasetMeta(name, data=rows))
    dataset.map("MessagesProcessor")
    dataset.set_template("Qwen3_5Template", model_id=MODEL_ID)
    elapsed, _ = timed(lambda: dataset.encode(num_proc=num_proc, load_from_cache_file=False))
    return elapsed, dataset


def feature_pairs(features: Any) -> Pairs:
    return [(f["input_ids"].tolist(), f["labels"].tolist()) for f in features]


def column_pairs(table: datasets.Dataset) -> Pairs:
    return list(zip(table["input_ids"], table["labels"], strict=True))


def first_mismatch(expected: Pairs, got: Pairs) -> str | None:
    if len(expected) != len(got):
        return f"{len(got)} rows encoded, baseline has {len(expected)}"
    for i, ((ids, labels), (our_ids, our_labels)) in enumerate(zip(expected, got, strict=True)):
        if ids != our_ids:
            return f"row {i}: input_ids differ"
        if labels != our_labels:
            at = next(j for j, (a, b) in enumerate(zip(labels, our_labels, strict=True)) if a != b)
            return f"row {i}: labels differ from token {at}"
    return None


def bench_set(name: str, rows: Rows, runs: int, template: Qwen3_5Template) -> tuple[list, list]:
    """Median rows/s (wall, CPU) of each way, interleaved run by run, and the label
    mismatches of the last run's outputs against the baseline's."""
    tokenizer = template.tokenizer
    # way -> (run it, giving its clock and output; turn that output into Pairs)
    ways: dict[str, tuple[Callable[[], tuple[Clock, Any]], Callable[[Any], Pairs]]] = {
        BASELINE_1: (lambda: timed(lambda: baseline_encode(tokenizer, rows)), list),
        "twinkle batch_encode, 1 process": (lambda: twinkle_encode(template, rows), feature_pairs),
        BASELINE_2: (lambda: baseline_map(tokenizer, rows, 2), column_pairs),
        "twinkle Dataset.encode, num_proc=2": (
            lambda: dataset_encode(name, rows, 2),
            feature_pairs,
        ),
    }
    clocks: dict[str, list[Clock]] = {way: [] for way in ways}
    outputs: dict[str, Pairs] = {}
    for run in range(runs):
        for way, (encode, pairs) in ways.items():
            elapsed, output = encode()
            clocks[way].append(elapsed)
            if run == runs - 1:
                outputs[way] = pairs(output)
    rates = {
        way: [len(rows) / statistics.median(c[i] for c in values) for i in (0, 1)]
        for way, values in clocks.items()
    }
    table, problems = [], []
    for way, (wall, cpu) in rates.items():
        against = rates[BASELINE_1 if "1 process" in way else BASELINE_2]
        table.append((name, len(rows), way, wall, wall / against[0], cpu, cpu / against[1]))
        mismatch = first_mismatch(outputs[BASELINE_1], outputs[way])
        if mismatch:
            problems.append(f"{name}, {way}: {mismatch}")
    return table, problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=10_000, help="synthetic multi-turn rows")
    parser.add_argument("--self-cognition-rows", type=int, default=2_000)
    args = parser.parse_args()
    datasets.disable_progress_bars()
    template = Qwen3_5Template(MODEL_ID)
    sets = {
        "self-cognition": self_cognition_rows(args.self_cognition_rows),
        "synthetic multi-turn": synthetic_rows(args.rows),
    }
    table, problems = [], []
    for name, rows in sets.items():
        set_table, set_problems = bench_set(name, rows, args.runs, template)
        table += set_table
        problems += set_problems
    print(
        f"# bench_data_encode: {datetime.date.today()}, {platform.platform()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, transformers "
        f"{transformers.__version__}, commit {commit()}\n"
    )
    print(
        f"Medians of {args.runs} interleaved runs; ratios against the baseline run the same "
        "way. TOKENIZERS_PARALLELISM=false: one thread per process on both sides.\n"
    )
    print("| set | rows | way | rows/s | ratio | rows/CPU-s | CPU ratio |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for name, count, way, wall, wall_ratio, cpu, cpu_ratio in table:
        ratios = (
            (f"{wall_ratio:.2f}×", f"{cpu_ratio:.2f}×") if way.startswith("twinkle") else ("", "")
        )
        print(
            f"| {name} | {count} | {way} | {wall:,.0f} | {ratios[0]} | {cpu:,.0f} | {ratios[1]} |"
        )
    lowest = min(row[6] for row in table if row[2].startswith("twinkle"))
    verdict = "OK" if lowest >= TARGET else "BELOW TARGET"
    print(f"\nlowest CPU ratio {lowest:.2f} (target {TARGET}): {verdict}")
    if problems:
        print("\nLABEL MISMATCHES against the baseline:\n" + "\n".join(problems))
        return 1
    print("labels: identical to the baseline's on every row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
