"""Tokens per second and MFU of TransformersModel training on one CUDA GPU, bf16.

A Qwen3-4B-shaped model (hidden 2560, 36 layers, 32 query / 8 key-value heads of 128,
MLP 9728, vocab 151,936, tied embeddings: 4.0B parameters), random init built directly on
the GPU, trained by the user's loop (``forward_backward`` then ``clip_grad_and_step``) on
random tokens, every position labelled. Weights and AdamW state stay float32, the forward
runs under bf16 autocast (``mixed_precision='auto'`` on a GPU with bf16). Two variants:
full-parameter training and LoRA (r=8, alpha 32, all-linear).

MFU counts model FLOPs, as torchtitan does: per token ``6 N + 12 L H T`` for full training
(N the parameters of every matmul, lm_head included and the embedding lookup not; L
layers, H = heads x head_dim, T the sequence length; attention counted without the causal
half, recomputation under gradient checkpointing not counted), and ``4 N + 8 L H T`` for
LoRA, whose backward computes no weight gradients for the frozen matrices. The peak is
the GPU's dense bf16 figure (known names below, else pass ``--peak-tflops``).

    python benchmarks/gpu/bench_model_gpu.py [--seq-len 2048] [--batch-size 4] [--steps 10]

Needs a CUDA GPU with about 80 GB for full training at the defaults (gradient
checkpointing on; ``--no-gradient-checkpointing`` to measure without it); it refuses to
run elsewhere. About two minutes on an H100/H200.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import subprocess
import sys
import time

import torch

QWEN3_4B = dict(
    vocab_size=151_936,
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
    max_position_embeddings=40_960,
    rope_theta=1_000_000.0,
)
# Dense bf16 tensor-core peaks, TFLOP/s, by a substring of torch.cuda.get_device_name().
PEAK_TFLOPS = {"H200": 989.5, "H100": 989.5, "H800": 989.5, "A100": 312.0, "A800": 312.0}


def peak_tflops(override: float | None) -> float | None:
    if override is not None:
        return override
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters of the Linear layers: what the per-token matmul FLOPs are made of."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def random_batch(config, batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=gen)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "position_ids": torch.arange(seq_len).expand(batch_size, -1).contiguous(),
        "labels": input_ids.clone(),
    }


def run(variant: str, args: argparse.Namespace) -> dict[str, float]:
    from peft import LoraConfig
    from transformers import Qwen3Config

    from twinkle.model import TransformersModel

    config = Qwen3Config(**{**QWEN3_4B, "num_hidden_layers": args.layers})
    gc.collect()  # the previous variant's model, optimizer and their reference cycles
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with torch.device("cuda"):  # random init on the GPU: seconds, not minutes on the CPU
        model = TransformersModel(
            config=config, device="cuda", gradient_checkpointing=args.gradient_checkpointing
        )
    n_matmul = matmul_params(model.model)
    if variant == "lora":
        model.add_adapter_to_model(
            "default", LoraConfig(r=8, lora_alpha=32, target_modules="all-linear")
        )
    model.set_optimizer("AdamW", lr=1e-5)
    batch = random_batch(config, args.batch_size, args.seq_len)
    for _ in range(args.warmup):
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.steps
    tokens_per_s = args.batch_size * args.seq_len / seconds
    attention = config.num_hidden_layers * config.num_attention_heads * config.head_dim
    if variant == "full":
        flops_per_token = 6 * n_matmul + 12 * attention * args.seq_len
    else:
        flops_per_token = 4 * n_matmul + 8 * attention * args.seq_len
    result = {
        "params_b": n_matmul / 1e9,
        "step_s": seconds,
        "tokens_per_s": tokens_per_s,
        "tflops": flops_per_token * tokens_per_s / 1e12,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }
    del model
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--variants", nargs="+", default=["full", "lora"], choices=["full", "lora"])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layers", type=int, default=QWEN3_4B["num_hidden_layers"])
    parser.add_argument(
        "--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, TFLOP/s")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit(
            "bench_model_gpu.py measures training on a CUDA GPU, and torch sees none here "
            "(torch.cuda.is_available() is False); run it on a machine with one. The CPU "
            "overhead benchmark is benchmarks/bench_model_overhead.py."
        )
    peak = peak_tflops(args.peak_tflops)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(
        f"{datetime.date.today()} · {torch.cuda.get_device_name()} · torch {torch.__version__} "
        f"· commit {commit or '?'} · batch {args.batch_size} x {args.seq_len} tokens · "
        f"gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}\n"
    )
    print("| training | params (B) | step s | tokens/s | model TFLOP/s | MFU | peak GiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for variant in args.variants:
        r = run(variant, args)
        mfu = f"{100 * r['tflops'] / peak:.1f}%" if peak else "pass --peak-tflops"
        print(
            f"| {variant} | {r['params_b']:.2f} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | "
            f"{r['tflops']:.0f} | {mfu} | {r['peak_gib']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
