"""Pipeline parallel on TransformersModel: the bubble of each schedule against
(p-1)/(m+p-1), and the bytes each rank sends per step against theory.

    python benchmarks/bench_parallel_pp.py        # launches itself under torchrun (2 ranks)

A Qwen3 of 8 decoder layers (hidden 256, vocabulary 4096, tied embedding, random init,
float32) trains full-parameter on pp_size=2 CPU ranks (gloo) through TransformersModel,
m micro-batches of one 128-token row a step. The stages are torch.distributed.pipelining's
``PipelineStage``; its methods are wrapped to measure:

- busy time: ``forward_one_chunk``, ``backward_one_chunk`` and the schedule's loss call;
  the idle fraction of a rank is 1 - busy / step time (the step being the schedule's call),
  averaged over the ranks. Theory for GPipe and 1F1B with equal stages and free
  communication: (p-1)/(m+p-1). The stages are not equal here (the split balances
  parameters, and the tied embedding counts on the first stage while its compute, the head
  and the loss, is on the last), so the table also gives the idle fraction expected from
  each stage's measured busy time per micro-batch t_i: a step spans t_0 + t_1 + (m-1)·max t_i
  and rank i is idle 1 - m·t_i / span of it.
- bytes sent: the tensors of ``get_fwd_send_ops`` / ``get_bwd_send_ops``, plus the
  all-reduce summing the tied embedding's two copies (stage 0 holds the embedding, stage 1
  the head) and the loss / norm scalars. Theory: each micro-batch's hidden states
  (rows × sequence × hidden × 4 bytes) forward from stage 0 and their gradient back from
  stage 1, plus one all-reduce of the vocabulary × hidden tied gradient (2(n-1)/n of it,
  n=2: its whole size).

The machine is shared: the idle fractions carry its noise (ratios of runs in one launch).
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

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from provenance import commit  # noqa: E402
from torchrun_launch import table_rows  # noqa: E402

CONFIG = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=4096,
    layer_types=["full_attention"] * 8,
)
SEQ_LEN = 128
BUSY = {"seconds": 0.0}
SENT = {"p2p": 0.0, "collective": 0.0}


def _timed(fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            BUSY["seconds"] += time.perf_counter() - start

    return wrapper


def _counted_sends(fn):
    def wrapper(*args, **kwargs):
        ops = fn(*args, **kwargs)
        SENT["p2p"] += sum(op.tensor.numel() * op.tensor.element_size() for op in ops)
        return ops

    return wrapper


def _counted_collective(fn):
    def wrapper(tensor, *args, **kwargs):
        world = dist.get_world_size(kwargs.get("group"))
        if world > 1:  # ring all-reduce / broadcast: 2(n-1)/n of the buffer
            SENT["collective"] += 2 * (world - 1) / world * tensor.numel() * tensor.element_size()
        return fn(tensor, *args, **kwargs)

    return wrapper


def instrument() -> None:
    from torch.distributed.pipelining import schedules
    from torch.distributed.pipelining.stage import _PipelineStageBase

    for name in ("forward_one_chunk", "backward_one_chunk"):
        setattr(_PipelineStageBase, name, _timed(getattr(_PipelineStageBase, name)))
    for name in ("get_fwd_send_ops", "get_bwd_send_ops"):
        setattr(_PipelineStageBase, name, _counted_sends(getattr(_PipelineStageBase, name)))
    base = schedules._PipelineSchedule
    base._maybe_compute_loss = _timed(base._maybe_compute_loss)
    dist.all_reduce = _counted_collective(dist.all_reduce)
    dist.broadcast = _counted_collective(dist.broadcast)


def child(schedule: str, micro_batches: int, steps: int) -> None:
    from transformers import AutoConfig

    import twinkle
    from twinkle import DeviceMesh
    from twinkle.hub import resolve_model
    from twinkle.model import TransformersModel
    from twinkle.model.transformers.strategy.pipeline import PipelineConfig

    mesh = DeviceMesh.from_sizes(pp_size=2, device_type="cpu")
    twinkle.initialize("local", global_device_mesh=mesh)
    config = AutoConfig.from_pretrained(resolve_model("bundled://tiny-qwen3"))
    for key, value in CONFIG.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = TransformersModel(
        "bundled://tiny-qwen3",
        device="cpu",
        config=config,
        pipeline_parallel=PipelineConfig(schedule=schedule),
    )
    model.set_optimizer("AdamW", lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    rows = [
        {"input_ids": ids, "labels": ids}
        for ids in torch.randint(
            1, CONFIG["vocab_size"], (micro_batches, SEQ_LEN), generator=generator
        ).tolist()
    ]
    instrument()
    pipeline = model._parallel().pipeline
    run = pipeline.run
    wall = {"seconds": 0.0}

    def timed_run(*args, **kwargs):
        start = time.perf_counter()
        try:
            return run(*args, **kwargs)
        finally:
            wall["seconds"] += time.perf_counter() - start

    pipeline.run = timed_run
    busy, spans, sent, collective, step_ms = [], [], [], [], []
    for _ in range(steps + 1):  # the first step builds the stages and is not counted
        BUSY["seconds"] = wall["seconds"] = 0.0
        SENT.update(p2p=0.0, collective=0.0)
        start = time.perf_counter()
        model.forward_backward(rows, micro_batch_size=1)
        model.clip_grad_and_step(1.0)
        step_ms.append(1e3 * (time.perf_counter() - start))
        busy.append(BUSY["seconds"])
        spans.append(wall["seconds"])
        sent.append(SENT["p2p"])
        collective.append(SENT["collective"])
    idle = [1 - b / w for b, w in zip(busy[1:], spans[1:], strict=True)]
    mine = torch.tensor(
        [statistics.median(idle), statistics.median(busy[1:]), sent[-1], collective[-1]],
        dtype=torch.float64,
    )
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    if dist.get_rank() == 0:
        p, m = 2, micro_batches
        activation = SEQ_LEN * CONFIG["hidden_size"] * 4
        tied = CONFIG["vocab_size"] * CONFIG["hidden_size"] * 4
        measured_idle = statistics.mean(float(e[0]) for e in every)
        theory_idle = (p - 1) / (m + p - 1)
        # Unequal stages: each micro-batch waits for the slower one (t per micro-batch).
        t = [float(e[1]) / m for e in every]
        span = sum(t) + (m - 1) * max(t)
        uneven_idle = statistics.mean(1 - m * ti / span for ti in t)
        p2p = [float(e[2]) for e in every]
        coll = [float(e[3]) for e in every]
        split = "/".join(str(len(r)) for r in pipeline.stages)
        print(
            f"| {schedule} | {split} | {m} | {measured_idle:.3f} | {theory_idle:.3f} "
            f"| {uneven_idle:.3f} | {1e3 * t[0]:.0f} / {1e3 * t[1]:.0f} "
            f"| {p2p[0] / 2**20:.2f} / {p2p[1] / 2**20:.2f} | {m * activation / 2**20:.2f} "
            f"| {coll[0] / 2**20:.2f} / {coll[1] / 2**20:.2f} | {tied / 2**20:.2f} "
            f"| {statistics.median(step_ms[1:]):.0f} |",
            flush=True,
        )
    dist.barrier()
    os._exit(0)  # gloo's teardown can abort a rank whose peer closed first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=3, help="counted steps per case")
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.micro_batches[0], args.steps)
        return
    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs · gloo, "
        f"pp_size=2 · torch {torch.__version__} · commit {commit()}\n"
    )
    print(
        "| schedule | layers per stage | m | idle (measured) | (p-1)/(m+p-1) "
        "| idle expected from the stage times | ms per micro-batch, stage 0 / 1 "
        "| p2p MiB sent, stage 0 / 1 | theory per stage | collective MiB, stage 0 / 1 "
        "| tied all-reduce theory | ms/step |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for schedule in ("GPipe", "1F1B"):
        for m in args.micro_batches:
            child_args = (
                "--child",
                schedule,
                "--micro-batches",
                str(m),
                "--steps",
                str(args.steps),
            )
            print(table_rows(__file__, 2, *child_args)[0], flush=True)


if __name__ == "__main__":
    main()
