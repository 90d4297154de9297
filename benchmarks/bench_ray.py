"""What ray mode costs: per-call overhead of @remote_function, and bytes through the driver.

1. **Per-call overhead.** A component on a group of two CPU workers whose method returns
   its input (``dispatch='all'``, ``collect='none'``, collected at once) against the same
   method on two raw Ray actors called as ``ray.get([a.work.remote(x) for a in actors])``.
   Both sides send the same small payload and get the same two results back. Rounds
   alternate the order of the sides; each round times ``--calls`` calls per side after a
   warm-up, and the table shows each side's median per call and the median over the rounds
   of the twinkle/raw ratio (target <= 1.3x).

2. **Driver traffic of an SFT loop.** ``--sft-steps`` steps of the two-group loop
   (``cookbook/ray/two_groups.py``: a DataLoader on a 'data' group, a TransformersModel on
   a 'model' group of two workers, ``calculate_metric`` each step), with
   ``lazy_collect=True`` and with ``False``: the pickled bytes of the arguments the driver
   sends and of the results it fetches (``count_driver_traffic``). Lazy must move only the
   metrics.

    .venv/bin/python benchmarks/bench_ray.py [--rounds 5] [--calls 300] [--sft-steps 10]

It starts a local Ray instance of its own (temp dir, no dashboard).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ["PYTHONDONTWRITEBYTECODE"] = ""

import ray  # noqa: E402

import twinkle  # noqa: E402
from twinkle import DeviceGroup, DeviceMesh, remote_class, remote_function  # noqa: E402
from twinkle.infra.ray import runtime as ray_runtime  # noqa: E402
from twinkle.infra.ray.traffic import count_driver_traffic  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from provenance import commit  # noqa: E402

PAYLOAD = {"input_ids": list(range(64)), "step": 3}
MODEL_ID = "bundled://tiny-qwen3"


@remote_class(execute="all")
class Echo:
    @remote_function(dispatch="all", collect="none", lazy_collect=False)
    def work(self, x):
        return x


class RawEcho:
    def work(self, x):
        return x


def time_calls(call, calls: int) -> float:
    """Median seconds per call over ``calls`` calls."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def overhead(rounds: int, calls: int) -> tuple[float, float, float]:
    twinkle.initialize("ray", groups=[DeviceGroup(name="bench", ranks=2, device_type="cpu")])
    echo = Echo(remote_group="bench")
    raw = [ray.remote(num_cpus=1)(RawEcho).remote() for _ in range(2)]

    def twinkle_call():
        return echo.work(PAYLOAD)

    def raw_call():
        return ray.get([a.work.remote(PAYLOAD) for a in raw])

    assert twinkle_call() == raw_call() == [PAYLOAD, PAYLOAD]
    for _ in range(100):  # warm-up: connections, code paths
        twinkle_call(), raw_call()
    ours, theirs, ratios = [], [], []
    for index in range(rounds):
        sides = [twinkle_call, raw_call] if index % 2 == 0 else [raw_call, twinkle_call]
        medians = {side: time_calls(side, calls) for side in sides}
        ours.append(medians[twinkle_call])
        theirs.append(medians[raw_call])
        ratios.append(medians[twinkle_call] / medians[raw_call])
    for actor in raw:
        ray.kill(actor)
    ray_runtime.shutdown()
    return statistics.median(ours), statistics.median(theirs), statistics.median(ratios)


def create_dataset():
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.preprocessor import SelfCognitionProcessor

    dataset = Dataset(DatasetMeta("bundled://self-cognition"))
    dataset.set_template("Qwen3_5Template", model_id=MODEL_ID)
    dataset.map(SelfCognitionProcessor("Twinkle", "ModelScope"))
    dataset.encode()
    return dataset


def sft_traffic(lazy: bool, steps: int) -> tuple[int, int, list[float]]:
    from twinkle.dataloader import DataLoader
    from twinkle.model import TransformersModel

    groups = [
        DeviceGroup(name="model", ranks=2, device_type="cpu"),
        DeviceGroup(name="data", ranks=1, device_type="cpu"),
    ]
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    twinkle.initialize("ray", groups=groups, lazy_collect=lazy)
    model = TransformersModel(model_id=MODEL_ID, device_mesh=mesh, remote_group="model")
    model.set_optimizer("AdamW", lr=1e-3)
    loader = DataLoader(create_dataset, batch_size=8, device_mesh=mesh, remote_group="data")
    losses = []
    with count_driver_traffic() as traffic:
        for step, batch in enumerate(loader):
            if step == steps:
                break
            model.forward_backward(inputs=batch)
            model.clip_grad_and_step()
            losses.append(model.calculate_metric(is_training=True)["loss"])
    ray_runtime.shutdown()
    return traffic.sent, traffic.received, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--sft-steps", type=int, default=10)
    args = parser.parse_args()
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=tempfile.mkdtemp(prefix="ray-bench-"),
    )
    ours, theirs, ratio = overhead(args.rounds, args.calls)
    traffic = {lazy: sft_traffic(lazy, args.sft_steps) for lazy in (True, False)}
    ray.shutdown()

    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, ray {ray.__version__} · commit {commit()}\n"
    )
    print("Per-call overhead over 2 actors, median (twinkle / raw Ray; target <= 1.3x)\n")
    print("| `@remote_function` call | raw actor calls | ratio |")
    print("| ---: | ---: | ---: |")
    print(f"| {ours * 1e3:.3f} ms | {theirs * 1e3:.3f} ms | {ratio:.2f}x |")
    print(f"\nBytes through the driver, {args.sft_steps}-step SFT loop (lazy moves metrics only)\n")
    print("| lazy_collect | sent | received | bytes per step |")
    print("| --- | ---: | ---: | ---: |")
    for lazy, (sent, received, _) in traffic.items():
        per_step = (sent + received) / args.sft_steps
        print(f"| {lazy} | {sent:,} | {received:,} | {per_step:,.0f} |")
    same = traffic[True][2] == traffic[False][2]
    print(f"\nSame losses with and without lazy collection: {same}")


if __name__ == "__main__":
    main()
