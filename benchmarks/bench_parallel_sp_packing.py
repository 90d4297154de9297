"""Padding-free by default under Ulysses SP and ring context parallel: tokens per second
against the same loop forced padded.

    python benchmarks/bench_parallel_sp_packing.py   # launches itself under torchrun: sp2, cp2

Both sides run the documents' loop, ``forward_backward`` then ``clip_grad_and_step``, on
``TransformersModel`` with the DeviceMesh of the layout over 2 ranks (gloo, CPU, float32),
over the same skewed sequences in the same order (log-normal lengths, median
``--median-length``, clipped to ``[8, --max-length]``; batches of ``--batch-size``, which
both ranks of the SP or cp group read):

* **padded**: ``set_processor(InputProcessor, padding_free=False)``: each batch padded to
  its longest, each rank running its slice of every padded row;
* **default**: no processor set; the model packs a batch's padding away where its cost
  estimate says so (``transformers.packing``) and the strategy splits the packed row.

Tokens per second count real tokens over one pass of the dataset; each side runs
``--rounds`` passes, alternating which goes first, after a one-step warm-up. The table
gives the median tokens/s per side by the wall clock and by CPU time (the mean over the
two ranks of ``time.process_time``: on a machine shared with other jobs the wall clock
measures mostly the others), the medians of the per-round ratios, and how many of the
default side's forwards ran one packed row. One thread per rank.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads: one thread per rank

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_parallel_packing import (  # noqa: E402
    model_config,
    one_pass,
    padded_batches,
    skewed_dataset,
)
from provenance import commit  # noqa: E402
from torchrun_launch import table_rows  # noqa: E402

LAYOUTS = {"sp2": {"ulysses_size": 2}, "cp2": {"cp_size": 2}}
SIZES = {"tiny": 64, "small": 16}  # sequences in the dataset, per model
LABELS = {"tiny": "tiny-qwen3", "small": "Qwen3 ~52M"}


def build(config, mesh, padded: bool):
    from twinkle.model import TransformersModel
    from twinkle.processor import InputProcessor

    torch.manual_seed(0)
    # A copy each: SP and cp set the attention implementation on the config they were given.
    model = TransformersModel(config=copy.deepcopy(config), device="cpu", device_mesh=mesh)
    if padded:
        model.set_processor(InputProcessor, padding_free=False)
    model.set_optimizer("AdamW", lr=1e-4)
    packed = [0]
    embeddings = model._hf_model().get_input_embeddings()
    embeddings.register_forward_hook(
        lambda m, args, out: packed.__setitem__(0, packed[0] + (args[0].shape[0] == 1))
    )
    return model, packed


def mean_over_ranks(value: float) -> float:
    total = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(total)
    return float(total) / dist.get_world_size()


def measure(name: str, layout: str, mesh, args) -> str:
    """One model's table row: both sides over the same batches, interleaved passes."""
    config = model_config(name)
    features = skewed_dataset(SIZES[name], args.median_length, args.max_length, config.vocab_size)
    batches = padded_batches(features, args.batch_size)
    tokens = sum(len(f["input_ids"]) for f in features)
    sides = {"padded": build(config, mesh, True), "default": build(config, mesh, False)}
    for model, _ in sides.values():
        one_pass(model, batches[:1])  # warm-up
    sides["default"][1][0] = 0
    rates = {(side, clock): [] for side in sides for clock in ("wall", "cpu")}
    for round_index in range(args.rounds):
        order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
        for side in order:
            wall, cpu = one_pass(sides[side][0], batches)
            rates[side, "wall"].append(tokens / wall)
            rates[side, "cpu"].append(tokens / mean_over_ranks(cpu))
    ratio = {
        clock: statistics.median(
            d / p for d, p in zip(rates["default", clock], rates["padded", clock], strict=True)
        )
        for clock in ("wall", "cpu")
    }
    slots = sum(len(b) * max(len(f["input_ids"]) for f in b) for b in batches)
    median = {key: statistics.median(values) for key, values in rates.items()}
    params = sum(p.numel() for p in sides["padded"][0].model.parameters())  # global sizes
    packed_forwards = sides["default"][1][0] // args.rounds
    return (
        f"| {layout} | {LABELS[name]} | {params / 1e6:.1f}M | {len(features)} | "
        f"{tokens} | {100 * (1 - tokens / slots):.0f}% | {len(batches)} | "
        f"{packed_forwards}/{len(batches)} | "
        f"{median['padded', 'wall']:,.0f} ({median['padded', 'cpu']:,.0f}) | "
        f"{median['default', 'wall']:,.0f} ({median['default', 'cpu']:,.0f}) | "
        f"{ratio['wall']:.2f}x | {ratio['cpu']:.2f}x |"
    )


def child(layout: str, args) -> None:
    from twinkle.mesh import DeviceMesh

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    mesh = DeviceMesh.from_sizes(
        world_size=dist.get_world_size(), device_type="cpu", **LAYOUTS[layout]
    )
    for name in args.models.split(","):
        row = measure(name, layout, mesh, args)
        if dist.get_rank() == 0:
            print(row, flush=True)
    dist.barrier()
    os._exit(0)  # gloo's teardown can abort a rank whose peer left first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="tiny,small")
    parser.add_argument("--layouts", default="sp2,cp2")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--median-length", type=int, default=48)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args)
        return
    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs · gloo, 2 ranks, "
        f"one thread each · torch {torch.__version__} · commit {commit()}\n"
    )
    print(
        f"Skewed lengths: log-normal, median {args.median_length}, clipped to [8, "
        f"{args.max_length}]; batches of {args.batch_size} sequences. Real tokens/s, median "
        f"of {args.rounds} interleaved passes; CPU: the ranks' mean process time.\n"
    )
    print(
        "| layout | model | params | sequences | tokens | padding in padded batches | steps | "
        "packed forwards | padded tok/s wall (cpu) | default tok/s wall (cpu) | ratio wall | "
        "ratio cpu |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    forwarded = ["--rounds", str(args.rounds), "--models", args.models]
    forwarded += ["--batch-size", str(args.batch_size), "--median-length", str(args.median_length)]
    forwarded += ["--max-length", str(args.max_length)]
    for layout in args.layouts.split(","):
        for row in table_rows(__file__, 2, "--child", layout, *forwarded):
            print(row, flush=True)


if __name__ == "__main__":
    main()
