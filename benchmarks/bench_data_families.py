"""Encode throughput of the generic Template on every bundled family's chat template
against ``tokenizer.apply_chat_template`` on the same rows.

The families' templates have no ``{% generation %}`` blocks (as models ship them), so
Template finds each trained reply by rendering the conversation up to it and through it
(at most two renders per trained turn). The baseline is ``apply_chat_template(messages,
return_dict=True, return_assistant_tokens_mask=True)`` per row, which gives a mask only for
a template with generation blocks: it runs a copy of each family's template with its replies
marked (``generation_blocks.py``; Qwen3's bundled template has them already, and Template
runs a copy without them). Labels are compared token for token on every row, the baseline's
mask cut to the last reply for ``'last'``; the run fails on any difference. Target:
Template >= 0.8x.

Rows: bench_data_encode's synthetic conversations (1-3 turns, every other with a system
prompt; Gemma folds it into the first user turn, as its template does), all
assistant turns trained (``train_turns='all'``) and the last only (``'last'``); Mistral's
template rewrites earlier turns (the system prompt moved to the last user turn), so it runs
'last' only (Qwen3's and Qwen3.5's drop only the empty think block of earlier replies,
which trains every turn). Medians of ``--runs``
interleaved runs, rows per CPU-second of this process.

    .venv/bin/python benchmarks/bench_data_families.py [--runs 5] [--rows 500]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from typing import Any

from bench_data_encode import baseline_encode, synthetic_rows
from generation_blocks import with_generation_blocks
from provenance import commit
from transformers import AutoTokenizer

from twinkle.hub import resolve_model
from twinkle.template import Template

FAMILIES = [
    "tiny-qwen3",
    "tiny-qwen2.5",
    "tiny-qwen3.5",
    "tiny-llama3",
    "tiny-mistral",
    "tiny-gemma3",
    "tiny-deepseek-v3",
    "tiny-glm4.5",
    "tiny-phi4",
]
REWRITES_HISTORY = {"tiny-mistral"}  # the system prompt moves to the last user turn
TARGET = 0.8


def ours(template: Template, data: list[dict[str, Any]], turns: str) -> list[tuple[list, list]]:
    features = template.batch_encode(data, train_turns=turns)
    return [(f["input_ids"].tolist(), f["labels"].tolist()) for f in features]


def cpu_seconds(run) -> tuple[float, Any]:
    start = time.process_time()
    result = run()
    return time.process_time() - start, result


def bench(name: str, data: list, runs: int, turns: str) -> dict[str, Any]:
    model_id = f"bundled://{name}"
    marked = AutoTokenizer.from_pretrained(resolve_model(model_id))
    source = marked.chat_template
    marked.chat_template = with_generation_blocks(name, source)
    bare = source.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
    template = Template(model_id, chat_template=bare)
    base_times, our_times, same = [], [], True
    for _ in range(runs):
        seconds, expected = cpu_seconds(lambda: baseline_encode(marked, data))
        base_times.append(seconds)
        seconds, got = cpu_seconds(lambda: ours(template, data, turns))
        our_times.append(seconds)
        if turns == "last":
            expected = [(ids, last_reply_only(labels)) for ids, labels in expected]
        same = same and got == expected
    base, mine = statistics.median(base_times), statistics.median(our_times)
    return {
        "family": name,
        "turns": turns,
        "baseline": len(data) / base,
        "twinkle": len(data) / mine,
        "ratio": base / mine,
        "labels": "exact" if same else "differ",
    }


def last_reply_only(labels: list[int]) -> list[int]:
    """A mask of every reply cut to the last one: what ``train_turns='last'`` labels."""
    end = max(i for i, label in enumerate(labels) if label != -100) + 1
    start = end
    while start > 0 and labels[start - 1] != -100:
        start -= 1
    return [-100] * start + labels[start:end] + [-100] * (len(labels) - end)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=500)
    args = parser.parse_args()
    data = synthetic_rows(args.rows)
    results = []
    for name in FAMILIES:
        for turns in ("last",) if name in REWRITES_HISTORY else ("all", "last"):
            results.append(bench(name, data, args.runs, turns))
    print(f"{datetime.date.today()}, {platform.node()}, commit {commit()}, rows {args.rows}")
    print(
        "| family | trained turns | baseline rows/CPU-s | Template rows/CPU-s | ratio "
        f"(target >= {TARGET}x) | labels |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in results:
        met = "met" if r["ratio"] >= TARGET else "not met"
        print(
            f"| {r['family']} | {r['turns']} | {r['baseline']:.0f} | {r['twinkle']:.0f} "
            f"| {r['ratio']:.2f}x, {met} | {r['labels']} |"
        )
    sys.exit(1 if any(r["labels"] == "differ" for r in results) else 0)


if __name__ == "__main__":
    main()
