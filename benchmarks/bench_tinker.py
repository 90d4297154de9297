r"""Tinker SDK round trip (forward_backward + optim_step) against the Twinkle client's same steps.

    python benchmarks/bench_tinker.py            # about 2 minutes on 2 CPU cores

One real server process on 127.0.0.1 (bundled tiny model, CPU), one API key, two adapters.
Baseline: the Twinkle client's ``forward_backward`` + ``step`` + ``zero_grad`` (three
HTTP calls, JSON tensors). Measured: the unmodified Tinker SDK's ``forward_backward``
(a protobuf body, then futures polled with ``retrieve_future``) + ``optim_step``, both
submitted before waiting ("pipelined", as the documents' loop does), and waiting for each
in turn ("sequential"). The data are the same features: the Tinker datums are made from
them with ``input_feature_to_datum``. The two sides alternate round by round, because the
VM's load drifts; each figure is the median over rounds of the median step of a round.
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

sys.path.insert(0, str(Path(__file__).parent))
from local_server import LocalServer  # noqa: E402
from provenance import commit  # noqa: E402

MODEL = "bundled://tiny-qwen3"
BATCH = [
    {"input_ids": list(range(1, 33)), "labels": [-100] * 8 + list(range(9, 33))} for _ in range(4)
]
RANK = 8
LR = 1e-4


def twinkle_steps(model, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.forward_backward(inputs=BATCH)
        model.step()
        model.zero_grad()
        times.append(time.perf_counter() - start)
    return times


def tinker_steps(training, data, steps: int, pipelined: bool) -> list[float]:
    from tinker import types

    adam = types.AdamParams(learning_rate=LR)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fwdbwd = training.forward_backward(data, "cross_entropy")
        if not pipelined:
            fwdbwd.result()
        optim = training.optim_step(adam)
        fwdbwd.result()
        optim.result()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6, help="steps per side per round")
    args = parser.parse_args()

    import tinker

    from twinkle.data_format import InputFeature
    from twinkle.server.common import input_feature_to_datum
    from twinkle_client import TwinkleClient
    from twinkle_client.model import MultiLoraTransformersModel

    data = [input_feature_to_datum(InputFeature(**row)) for row in BATCH]
    runs: dict[str, list[float]] = {"twinkle": [], "pipelined": [], "sequential": []}
    with tempfile.TemporaryDirectory() as home:
        server = LocalServer(Path(home), ["bench"], max_loras=4)
        key = server.keys[0]
        try:
            client = TwinkleClient(server.url, key)
            model = MultiLoraTransformersModel(model_id=MODEL, client=client)
            model.add_adapter_to_model("default", {"r": RANK, "target_modules": "all-linear"})
            model.set_loss("CrossEntropyLoss")
            model.set_optimizer("AdamW", lr=LR)
            service = tinker.ServiceClient(base_url=server.url, api_key=key)
            training = service.create_lora_training_client(base_model=MODEL, rank=RANK).result()
            twinkle_steps(model, 2)  # warm-up both paths
            tinker_steps(training, data, 2, pipelined=True)
            for _ in range(args.rounds):
                runs["twinkle"].append(statistics.median(twinkle_steps(model, args.steps)))
                for mode in ("pipelined", "sequential"):
                    steps = tinker_steps(training, data, args.steps, mode == "pipelined")
                    runs[mode].append(statistics.median(steps))
            service.close("success").result()
            client.close()
        finally:
            server.stop()

    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, tinker {tinker.__version__} · commit {commit()}\n"
    )
    print(
        f"One training step (forward_backward + optimizer step) on {MODEL}, batch 4 x 32 "
        f"tokens (24 trained each), LoRA r={RANK}, through HTTP to a server on 127.0.0.1. "
        f"Median over {args.rounds} rounds of the median of {args.steps} steps.\n"
    )
    base = statistics.median(runs["twinkle"])
    print("| client | step ms (median) | min round ms | max round ms | vs Twinkle client |")
    print("| --- | ---: | ---: | ---: | ---: |")
    labels = {
        "twinkle": "Twinkle client: forward_backward, step, zero_grad (baseline)",
        "pipelined": "Tinker SDK: forward_backward + optim_step submitted together",
        "sequential": "Tinker SDK: forward_backward, wait, optim_step",
    }
    for name, label in labels.items():
        values = runs[name]
        median = statistics.median(values)
        print(
            f"| {label} | {median * 1e3:.1f} | {min(values) * 1e3:.1f} "
            f"| {max(values) * 1e3:.1f} | {median / base:.2f}x |"
        )


if __name__ == "__main__":
    main()
