"""Ring attention's bytes on the wire per training step, against theory.

    python benchmarks/bench_parallel_cp.py     # launches itself under torchrun, cp2 then cp4

A Qwen3 (random init, float32, L layers, Hkv key/value heads of D dims) runs forward and
backward on one long row through ``ContextParallelStrategy`` over ``cp`` ranks (gloo). The
ring's sends are counted at ``torch.distributed.batch_isend_irecv`` (the payload of each
``isend``); gradient all-reduces are not counted (the data-parallel strategy's, as without
cp). Per layer, one rank's key/value block is KV = 2 · Hkv · (T / cp) · D · b bytes. Theory:
forward (cp − 1) · KV (each block goes round once); backward (cp − 1) · KV again plus
cp · KV for the blocks' gradients (accumulated in float32 and carried home one step after
the last): L · (3 cp − 2) · KV per step. The gathers of each rank's label logps and
predicted ids (12 bytes a token) are not counted either; they are not ring attention's.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from provenance import commit  # noqa: E402
from torchrun_launch import table_rows  # noqa: E402

CONFIG = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
)
SENT = {"bytes": 0}


def _counting(original):
    def batch_isend_irecv(ops):
        SENT["bytes"] += sum(op.tensor.nbytes for op in ops if op.op is dist.isend)
        return original(ops)

    return batch_isend_irecv


def child(length: int, steps: int) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from twinkle.mesh import DeviceMesh
    from twinkle.model.transformers.strategy.context_parallel import ContextParallelStrategy

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    cp = dist.get_world_size()
    dist.batch_isend_irecv = _counting(dist.batch_isend_irecv)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3", **CONFIG)).float()
    strategy = ContextParallelStrategy(DeviceMesh.from_sizes(cp_size=cp, device_type="cpu"))
    strategy.apply(model)
    ids = torch.randint(1, CONFIG["vocab_size"], (1, length), generator=torch.Generator())
    batch = {"input_ids": ids, "labels": ids.clone()}
    per_step = []
    for _ in range(steps):
        SENT["bytes"] = 0
        inputs, shard = strategy.shard(batch)
        logits = model(**inputs, use_cache=False).logits
        shard.outputs(logits)["logps"].sum().backward()
        per_step.append(SENT["bytes"])
    kv = 2 * CONFIG["num_key_value_heads"] * (length // cp) * CONFIG["head_dim"] * 4
    theory = CONFIG["num_hidden_layers"] * (3 * cp - 2) * kv
    if dist.get_rank() == 0:
        measured = max(per_step)
        print(
            f"| cp{cp} | {length} | {CONFIG['num_hidden_layers']} | {kv / 2**10:.0f} | "
            f"{measured / 2**20:.3f} | {theory / 2**20:.3f} | {measured / theory:.3f} |"
        )
    dist.barrier()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--length", type=int, default=2048, help="tokens in the row")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--ranks", default="2,4", help="cp sizes, one launch each")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.length, args.steps)
        return
    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs · gloo · "
        f"torch {torch.__version__} · commit {commit()}\n"
    )
    print("Ring attention: bytes one rank sends per step (forward + backward, MiB)\n")
    print("| cp | tokens | layers | KV block (KiB) | measured | theory L·(3cp−2)·KV | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for ranks in map(int, args.ranks.split(",")):
        child_args = ("--child", "--length", str(args.length), "--steps", str(args.steps))
        print(table_rows(__file__, ranks, *child_args)[0], flush=True)


if __name__ == "__main__":
    main()
