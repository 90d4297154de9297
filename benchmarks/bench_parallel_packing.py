"""Padding-free (packed) against padded training: tokens per second on skewed lengths.

The dataset is synthetic and skewed, as chat data is: sequence lengths drawn from a
log-normal (median ``--median-length`` tokens, sigma 1.0) clipped to ``[8, --max-length]``,
random token ids, every token labelled. Both sides train the same model (same seed, float32,
CPU) by the user's loop, ``forward_backward`` then ``clip_grad_and_step``, over the same
sequences in the same order:

* **padded**: batches of ``--batch-size`` sequences in dataset order (as a DataLoader gives
  them), each padded to its longest (``InputProcessor()``);
* **padding-free**: the same batches, each concatenated into one row with per-sequence
  position_ids and cu_seq_lens (``InputProcessor(padding_free=True)``). Same steps, same
  sequences per step, the same loss and gradients (tests/test_padding_free.py): only the
  padding is gone.

Tokens per second count real tokens only (padding excluded), over one pass of the
dataset; each side runs ``--rounds`` passes, alternating which side goes first, after a
one-step warm-up. The table shows the median tokens/s per side and the median of the
per-round ratios (target >= 1.5x), by the wall clock and by this process's CPU time
(``time.process_time``): on a machine shared with other jobs the wall clock measures
mostly the others, the CPU time the work done (run with ``OMP_NUM_THREADS=1`` there, so
that idle-spinning threads do not count). Models: ``bundled://tiny-qwen3`` (0.3M parameters), a
~52M Qwen3 (hidden 512, 16 layers, MLP 1536) and a tiny Qwen3.5 (GatedDeltaNet linear
attention mixed with full attention; its packed path runs twinkle-kernels' varlen torch
reference on the CPU).

    .venv/bin/python benchmarks/bench_parallel_packing.py [--rounds 3] [--models tiny,small]

Threads: ``OMP_NUM_THREADS`` defaults to the number of CPUs, set before torch loads.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from provenance import commit  # noqa: E402

TINY = "bundled://tiny-qwen3"
SIZES = {"tiny": 96, "small": 32, "qwen3_5": 96}  # sequences in the dataset, per model


def model_config(name: str):
    from transformers import AutoConfig, Qwen3_5TextConfig, Qwen3Config

    from twinkle.hub import resolve_model

    tiny = AutoConfig.from_pretrained(resolve_model(TINY))
    if name == "tiny":
        return tiny
    if name == "small":
        return Qwen3Config(
            vocab_size=tiny.vocab_size,
            pad_token_id=0,
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=16,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            tie_word_embeddings=True,
        )
    return Qwen3_5TextConfig(
        vocab_size=tiny.vocab_size,
        pad_token_id=0,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention"] * 2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        tie_word_embeddings=True,
    )


def skewed_dataset(count: int, median: int, max_length: int, vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(median), 1.0, count).astype(int), 8, max_length)
    return [
        {"input_ids": ids, "labels": ids}
        for ids in (rng.integers(1, vocab, n).tolist() for n in lengths)
    ]


def padded_batches(features: list, batch_size: int) -> list:
    return [features[i : i + batch_size] for i in range(0, len(features), batch_size)]


def build(config, padding_free: bool):
    from twinkle.model import TransformersModel
    from twinkle.processor import InputProcessor

    model = TransformersModel(config=config, device="cpu")
    model.set_processor(InputProcessor, padding_free=padding_free)
    model.set_optimizer("AdamW", lr=1e-4)
    return model


def one_pass(model, batches: list) -> tuple[float, float]:
    """Wall-clock and CPU seconds (this process, all its threads) of one pass."""
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        model.forward_backward(batch)
        model.clip_grad_and_step()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(name: str, rounds: int, args) -> dict:
    config = model_config(name)
    features = skewed_dataset(SIZES[name], args.median_length, args.max_length, config.vocab_size)
    tokens = sum(len(f["input_ids"]) for f in features)
    sides = {
        "padded": (build(config, False), padded_batches(features, args.batch_size)),
        "packed": (build(config, True), padded_batches(features, args.batch_size)),
    }
    for model, batches in sides.values():
        one_pass(model, batches[:1])  # warm-up
    rates = {(side, clock): [] for side in sides for clock in ("wall", "cpu")}
    for round_index in range(rounds):
        order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
        for side in order:
            model, batches = sides[side]
            wall, cpu = one_pass(model, batches)
            rates[side, "wall"].append(tokens / wall)
            rates[side, "cpu"].append(tokens / cpu)

    def ratio(clock: str) -> float:
        pairs = zip(rates["packed", clock], rates["padded", clock], strict=True)
        return statistics.median(p / q for p, q in pairs)

    padded_slots = sum(len(b) * max(len(f["input_ids"]) for f in b) for b in sides["padded"][1])
    return {
        "params": sum(p.numel() for p in sides["padded"][0].model.parameters()),
        "sequences": len(features),
        "tokens": tokens,
        "padding": 1 - tokens / padded_slots,
        "steps": len(sides["padded"][1]),
        "rates": {key: statistics.median(values) for key, values in rates.items()},
        "ratio": {clock: ratio(clock) for clock in ("wall", "cpu")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="tiny,small,qwen3_5")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--median-length", type=int, default=48)
    parser.add_argument("--max-length", type=int, default=512)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, "
        f"commit {commit()}\n"
    )
    print(
        f"Skewed lengths: log-normal, median {args.median_length}, clipped to [8, "
        f"{args.max_length}]; batches of {args.batch_size} sequences, padded or concatenated. "
        f"Tokens/s of real tokens, median of {args.rounds} passes.\n"
    )
    print(
        "| model | params | sequences | tokens | padding in padded batches | steps | padded "
        "tok/s wall (cpu) | padding-free tok/s wall (cpu) | ratio wall | ratio cpu (target >= "
        "1.5x) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.models.split(","):
        r = measure(name, args.rounds, args)
        rates = r["rates"]
        label = {"tiny": "tiny-qwen3", "small": "Qwen3 ~52M", "qwen3_5": "tiny Qwen3.5"}[name]
        print(
            f"| {label} | {r['params'] / 1e6:.1f}M | {r['sequences']} | {r['tokens']} | "
            f"{100 * r['padding']:.0f}% | {r['steps']} | "
            f"{rates['padded', 'wall']:,.0f} ({rates['padded', 'cpu']:,.0f}) | "
            f"{rates['packed', 'wall']:,.0f} ({rates['packed', 'cpu']:,.0f}) | "
            f"{r['ratio']['wall']:.2f}x | {r['ratio']['cpu']:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
