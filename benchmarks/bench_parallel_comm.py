"""Communication volume per optimizer step, FSDP2 vs DDP vs tensor parallel, against the
theoretical values.

    python benchmarks/bench_parallel_comm.py            # launches itself under torchrun (2 ranks)

A ~50M-parameter Qwen3 (random init, float32) trains full-parameter on 2 CPU ranks (gloo)
through ``twinkle.model.transformers.strategy.parallelize``. Bytes are counted by hooks:
FSDP2's collectives (``all_gather_single``, ``reduce_scatter_single``, ``all_reduce``)
are wrapped at ``torch.distributed``, and DDP's bucket all-reduces by a DDP comm hook.
Each collective's payload is turned into the bytes one rank sends with the ring
algorithm: all-reduce 2(n-1)/n of its buffer, all-gather and reduce-scatter (n-1)/n of
the full tensor. Theory, with P parameters of b bytes: DDP 2(n-1)/n·P·b (one all-reduce
of every gradient); FSDP2 3(n-1)/n·P·b (all-gather in forward, again in backward,
reduce-scatter of the gradients). The root module (embeddings, head, final norm) keeps
its parameters gathered from forward to backward, so FSDP2 measures below 3(n-1)/n by
the root's share of one all-gather.

Tensor parallel (``tp``: every rank runs the same batch, DTensor's functional collectives
counted at ``torch.distributed._functional_collectives``): activations, not weights, travel.
With A = rows × sequence × hidden × b bytes, each layer all-reduces A twice in forward
(after o_proj and down_proj) and, with torch's one module per projection, five times in
backward (the input gradients of q, k, v and of gate, up; Megatron's fused qkv and gate/up
need two), plus the q/k norm gradients: theory 7·L·2(n-1)/n·A, Megatron's 4·L·2(n-1)/n·A.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from provenance import commit  # noqa: E402
from torchrun_launch import table_rows  # noqa: E402

CONFIG = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=10,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    tie_word_embeddings=True,
)
ROWS_PER_RANK, SEQ_LEN = 2, 128
# The torch.distributed functions FSDP2 calls, and which argument is the full tensor.
FSDP_COLLECTIVES = (("all_gather_single", 0), ("reduce_scatter_single", 1), ("all_reduce", 0))
COUNTS: Counter = Counter()
CALLS: Counter = Counter()


def ring_bytes(op: str, tensor: torch.Tensor, world: int) -> float:
    size = tensor.numel() * tensor.element_size()
    factor = {"all_reduce": 2 * (world - 1) / world}.get(op, (world - 1) / world)
    return factor * size


def count_fsdp_collectives(world: int) -> None:
    """Wrap the torch.distributed functions FSDP2 calls (it looks them up on the module)."""
    for op, tensor_arg in (
        ("all_gather_single", 0),
        ("reduce_scatter_single", 1),
        ("all_reduce", 0),
    ):
        original = getattr(dist, op)

        def counted(*args, _op=op, _original=original, _index=tensor_arg, **kwargs):
            full = args[_index] if len(args) > _index else kwargs.get("input", kwargs.get("tensor"))
            kind = "all_reduce" if _op == "all_reduce" else _op
            COUNTS[kind] += ring_bytes(kind, full, world)
            CALLS[kind] += 1
            return _original(*args, **kwargs)

        setattr(dist, op, counted)


def count_tensor_parallel_collectives(world: int) -> None:
    """Wrap the functional collectives DTensor redistributes with, and ``dist.all_reduce``
    (the q/k norm gradients)."""
    import torch.distributed._functional_collectives as funcol

    for module, op in ((funcol, "all_reduce"), (dist, "all_reduce")):
        original = getattr(module, op)

        def counted(tensor, *args, _original=original, **kwargs):
            COUNTS["all_reduce"] += ring_bytes("all_reduce", tensor, world)
            CALLS["all_reduce"] += 1
            return _original(tensor, *args, **kwargs)

        setattr(module, op, counted)


def count_ddp_buckets(wrapper, world: int) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def hook(group, bucket):
        COUNTS["all_reduce"] += ring_bytes("all_reduce", bucket.buffer(), world)
        CALLS["all_reduce"] += 1
        return default_hooks.allreduce_hook(group, bucket)

    wrapper.register_comm_hook(None, hook)


def child(strategy: str, steps: int) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from twinkle import DeviceMesh
    from twinkle.model.transformers.strategy import parallelize

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    sizes = {"fsdp2": {"fsdp_size": world}, "tp": {"tp_size": world}}.get(
        strategy, {"dp_size": world}
    )
    mesh = DeviceMesh.from_sizes(**sizes, device_type="cpu")
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**CONFIG))
    params = sum(p.numel() for p in model.parameters())
    plan = parallelize(model, mesh)
    if strategy == "ddp":
        count_ddp_buckets(plan.root("bench"), world)
    elif strategy == "tp":
        count_tensor_parallel_collectives(world)
    else:
        count_fsdp_collectives(world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0 if strategy == "tp" else rank)
    batch = torch.randint(0, CONFIG["vocab_size"], (ROWS_PER_RANK, SEQ_LEN), generator=generator)
    per_step, seconds = [], []
    for _ in range(steps + 1):  # the first step warms up and is not counted
        COUNTS.clear()
        CALLS.clear()
        start = time.perf_counter()
        loss = plan.run("bench", lambda ids: model(input_ids=ids, labels=ids).loss, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
        per_step.append((dict(COUNTS), dict(CALLS)))
    counts, calls = per_step[-1]
    assert all(c == counts for c, _ in per_step[1:]), "the volume changed between steps"
    if rank == 0:
        if strategy == "tp":  # activations: 7 all-reduces a layer (module docstring)
            activation = ROWS_PER_RANK * SEQ_LEN * CONFIG["hidden_size"] * 4
            layers = CONFIG["num_hidden_layers"]
            theory = 7 * layers * 2 * (world - 1) / world * activation
            print(f"tp: Megatron's fused layout would send {4 / 7 * theory / 2**20:.1f} MiB")
        else:
            theory = {"ddp": 2, "fsdp2": 3}[strategy] * (world - 1) / world * params * 4
        measured = sum(counts.values())
        detail = ", ".join(f"{op} {calls[op]}× {counts[op] / 2**20:.1f}" for op in sorted(counts))
        print(
            f"| {strategy} | {params / 1e6:.1f}M | {measured / 2**20:.1f} | {theory / 2**20:.1f} "
            f"| {measured / theory:.3f} | {detail} | "
            f"{1e3 * statistics.median(seconds[1:]):.0f} |",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


def launch(strategy: str, steps: int, ranks: int) -> str:
    return table_rows(__file__, ranks, "--child", strategy, "--steps", str(steps))[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=3, help="counted steps per strategy")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.steps)
        return
    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs · gloo, "
        f"{args.ranks} ranks · torch {torch.__version__} · commit {commit()}\n"
    )
    print("Bytes one rank sends per optimizer step (MiB, ring algorithm), full training\n")
    print("| strategy | params | measured | theoretical | ratio | per collective (MiB) | ms/step |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    for strategy in ("ddp", "fsdp2", "tp"):
        print(launch(strategy, args.steps, args.ranks))


if __name__ == "__main__":
    main()
