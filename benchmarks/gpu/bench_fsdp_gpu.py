"""Tokens per second and MFU of FSDP2 training (twinkle's strategy) on the visible CUDA GPUs.

    python benchmarks/gpu/bench_fsdp_gpu.py [--gpus 1] [--layers 36] [--seq-len 2048]

Launches itself under torchrun, one rank per GPU (``--gpus``, default all visible; one
is enough). A Qwen3-4B-shaped model (as in ``bench_model_gpu.py``; random init on the
GPU) is sharded by ``twinkle.model.transformers.strategy.fsdp.apply_fsdp``: each decoder
layer, then the root, on a 1-D ``fsdp`` mesh of all ranks, with the bf16
MixedPrecisionPolicy that ``mixed_precision='auto'`` picks on such a GPU (float32
gradient reduction, float32 master weights and AdamW state). On one GPU the mesh has one
rank: the collectives are local copies and the figure is FSDP2's own overhead against
``bench_model_gpu.py``'s unsharded step. It calls ``apply_fsdp`` directly because
``parallelize`` (rightly) wraps nothing on one process. Full-parameter training on random
tokens, every position labelled, gradient checkpointing on (``--no-gradient-checkpointing``).

MFU counts model FLOPs as ``bench_model_gpu.py`` does (``6 N + 12 L H T`` per token), per
GPU, against the dense bf16 peak (known names below, else ``--peak-tflops``). Refuses to
run without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

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
)
PEAK_TFLOPS = {"H200": 989.5, "H100": 989.5, "H800": 989.5, "A100": 312.0, "A800": 312.0}


def child(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from twinkle.model.transformers.strategy.fsdp import apply_fsdp
    from twinkle.model.transformers.strategy.grads import clip_grad_norm

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    config = Qwen3Config(**{**QWEN3_4B, "num_hidden_layers": args.layers})
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(config)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    n_matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    root = apply_fsdp(model, init_device_mesh("cuda", (world,), mesh_dim_names=("fsdp",)), "bf16")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    gen = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len), generator=gen)
    ids = ids.cuda()

    def step() -> None:
        loss = root(lambda x: model(input_ids=x, labels=x, use_cache=False).loss, ids)
        loss.backward()
        clip_grad_norm(list(model.parameters()), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.steps
    tokens_per_s = args.batch_size * args.seq_len / seconds  # per GPU
    attention = config.num_hidden_layers * config.num_attention_heads * config.head_dim
    tflops = (6 * n_matmul + 12 * attention * args.seq_len) * tokens_per_s / 1e12
    peak = args.peak_tflops or next(
        (p for k, p in PEAK_TFLOPS.items() if k in torch.cuda.get_device_name()), None
    )
    if rank == 0:
        mfu = f"{100 * tflops / peak:.1f}%" if peak else "pass --peak-tflops"
        print(
            f"| FSDP2 x{world} | {n_matmul / 1e9:.2f} | {seconds:.3f} | {tokens_per_s:,.0f} | "
            f"{tflops:.0f} | {mfu} | {torch.cuda.max_memory_allocated() / 2**30:.1f} |",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--gpus", type=int, default=None, help="ranks (default: every GPU)")
    parser.add_argument("--layers", type=int, default=QWEN3_4B["num_hidden_layers"])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, TFLOP/s")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit(
            "bench_fsdp_gpu.py measures FSDP2 training on CUDA GPUs, and torch sees none here "
            "(torch.cuda.is_available() is False); run it on a machine with one. The CPU "
            "figures for the strategies are benchmarks/bench_parallel_comm.py's."
        )
    if args.child:
        child(args)
        return
    gpus = args.gpus or torch.cuda.device_count()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sys.path.insert(0, str(Path(__file__).parents[1]))
    from provenance import commit

    print(
        f"{datetime.date.today()} · {torch.cuda.get_device_name()} x{gpus} · torch "
        f"{torch.__version__} · commit {commit()} · batch {args.batch_size} x {args.seq_len} "
        f"tokens per GPU · gradient checkpointing "
        f"{'on' if args.gradient_checkpointing else 'off'}\n"
    )
    print("| strategy | params (B) | step s | tokens/s/GPU | model TFLOP/s | MFU | peak GiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
    forwarded = [a for a in sys.argv[1:] if a != "--child"]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={gpus}",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        __file__,
        "--child",
        *forwarded,
    ]
    subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
