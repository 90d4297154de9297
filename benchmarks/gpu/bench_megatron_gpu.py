"""Tokens per second and MFU of MegatronModel against TransformersModel on one CUDA GPU, bf16.

A Qwen3-1.7B-shaped model (hidden 2048, 28 layers, 16 query / 8 key-value heads of 128,
MLP 6144, vocab 151,936, tied embeddings), random init from one seed (both backends get
the same weights: MegatronModel converts the Hugging Face init), full-parameter training
by the user's loop (``forward_backward`` then ``clip_grad_and_step``) on random tokens,
every position labelled. MegatronModel runs megatron-core's local layer spec (no
Transformer Engine), bf16 weights with fp32 master weights in Megatron's optimizer;
TransformersModel keeps fp32 weights under bf16 autocast. Both use AdamW.

MFU counts model FLOPs per token, ``6 N + 12 L H T`` (N the matmul parameters, lm_head
included; L layers, H = heads x head_dim, T the sequence length), against the GPU's dense
bf16 peak (known names below, else ``--peak-tflops``). The first-step losses of the two
backends are printed side by side as a sanity check (same weights, same batch).

    python benchmarks/gpu/bench_megatron_gpu.py [--seq-len 2048] [--batch-size 2] [--steps 8]

Needs a CUDA GPU (about 40 GB at the defaults) and ``twinkle-models[megatron]``; refuses
to run elsewhere. Each backend runs in its own process (Megatron's state is global).
The Transformer Engine layer spec is not measured: MegatronModel builds the local spec.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time

import torch

QWEN3_1_7B = dict(
    vocab_size=151_936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
    max_position_embeddings=40_960,
)
PEAK_TFLOPS = {"H200": 989.5, "H100": 989.5, "H800": 989.5, "A100": 312.0, "A800": 312.0}


def model_config():
    from transformers import Qwen3Config

    layers = QWEN3_1_7B["num_hidden_layers"]
    return Qwen3Config(**QWEN3_1_7B, layer_types=["full_attention"] * layers)


def run(backend: str, args: argparse.Namespace) -> dict:
    from twinkle.model import MegatronModel, TransformersModel

    config = model_config()
    if backend == "megatron":
        model = MegatronModel(config=config, mixed_precision="bf16")
    else:
        model = TransformersModel(config=config, mixed_precision="bf16")
    model.set_optimizer("AdamW", lr=1e-5)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len), generator=generator)
    batch = {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}
    losses, times = [], []
    for step in range(args.steps + 2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        losses.append(model.forward_backward(batch).loss)
        model.clip_grad_and_step(1.0)
        torch.cuda.synchronize()
        if step >= 2:
            times.append(time.perf_counter() - start)
    step_time = sorted(times)[len(times) // 2]
    tokens = args.batch_size * args.seq_len
    h = config.hidden_size
    per_layer = 2 * h * config.num_attention_heads * config.head_dim + 2 * h * (
        config.num_key_value_heads * config.head_dim
    )
    per_layer += 3 * h * config.intermediate_size
    n = config.num_hidden_layers * per_layer + config.vocab_size * h
    attention = 12 * config.num_hidden_layers * config.num_attention_heads * config.head_dim
    flops = tokens * (6 * n + attention * args.seq_len)
    return {
        "backend": backend,
        "step": step_time,
        "tokens_per_s": tokens / step_time,
        "tflops": flops / step_time / 1e12,
        "first_loss": losses[0],
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--peak-tflops", type=float)
    parser.add_argument("--backend", choices=("megatron", "transformers"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_megatron_gpu.py needs a CUDA GPU")
    if args.backend:
        print(json.dumps(run(args.backend, args)))
        return
    rows = []
    for backend in ("transformers", "megatron"):
        command = [sys.executable, __file__, "--backend", backend]
        command += ["--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size)]
        command += ["--steps", str(args.steps)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{backend} failed:\n{done.stderr[-4000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    name = torch.cuda.get_device_name()
    peak = args.peak_tflops or next((p for k, p in PEAK_TFLOPS.items() if k in name), None)
    print(f"\n{datetime.date.today()} {name}, Qwen3-1.7B-shaped, bf16, ")
    print(f"batch {args.batch_size} x {args.seq_len}\n")
    print("| backend | step s | tokens/s | model TFLOP/s | MFU | peak GiB | first loss |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        mfu = f"{100 * r['tflops'] / peak:.1f}%" if peak else "pass --peak-tflops"
        print(
            f"| {r['backend']} | {r['step']:.3f} | {r['tokens_per_s']:,.0f} | "
            f"{r['tflops']:.0f} | {mfu} | {r['peak_gib']:.1f} | {r['first_loss']:.4f} |"
        )


if __name__ == "__main__":
    main()
