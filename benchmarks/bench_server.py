r"""twinkle-server: forward_backward over HTTP against the same call in process; LoRA slot churn.

    python benchmarks/bench_server.py            # about 2 minutes on 2 CPU cores

Baseline: ``MultiLoraTransformersModel.forward_backward`` called in this process on the
tiny model, one adapter after another (what the server's worker does). Measured: the same
call through twinkle-client to a real server process on 127.0.0.1, with 1, 4 and 16
tenants (one API key, session and adapter each, one thread each) calling concurrently.
The server runs one model's work on one thread, so throughput cannot exceed the in-process
rate: the table shows what HTTP, JSON and the scheduler add per call, and how latency
grows as tenants share the worker (round robin keeps p99 near ``tenants x call``).
Churn: create an adapter, set its optimizer, train one step, save, release the slot.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from local_server import LocalServer  # noqa: E402
from provenance import commit  # noqa: E402

BATCH = [
    {"input_ids": list(range(1, 33)), "labels": [-100] * 8 + list(range(9, 33))} for _ in range(4)
]
LORA = {"r": 8, "target_modules": "all-linear", "lora_dropout": 0.0}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def in_process(calls: int, adapters: int) -> list[float]:
    from peft import LoraConfig

    from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel

    model = MultiLoraTransformersModel("bundled://tiny-qwen3", max_loras=adapters, device="cpu")
    names = [f"a{i}" for i in range(adapters)]
    for name in names:
        model.add_adapter_to_model(name, LoraConfig(**LORA))
    times = []
    for i in range(calls + 3):
        start = time.perf_counter()
        model.forward_backward(BATCH, adapter_name=names[i % adapters])
        if i >= 3:
            times.append(time.perf_counter() - start)
    return times


def over_http(
    server: LocalServer, tenants: int, calls: int
) -> tuple[list[float], list[float], float]:
    from twinkle_client import TwinkleClient
    from twinkle_client.model import MultiLoraTransformersModel

    clients = [TwinkleClient(server.url, key) for key in server.keys[:tenants]]
    models = []
    for client in clients:
        model = MultiLoraTransformersModel(client=client)
        model.add_adapter_to_model("default", LORA)
        model.forward_backward(BATCH)  # warm-up
        models.append(model)
    latencies: list[float] = []
    computes: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(tenants + 1)

    def tenant(model) -> None:
        barrier.wait()
        mine, work = [], []
        for _ in range(calls):
            start = time.perf_counter()
            model.forward_backward(BATCH)
            mine.append(time.perf_counter() - start)
            work.append(model.client.last_compute_ms / 1e3)
        with lock:
            latencies.extend(mine)
            computes.extend(work)

    threads = [threading.Thread(target=tenant, args=(m,)) for m in models]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    for client in clients:
        client.close()
    return latencies, computes, len(latencies) / wall


def churn(server: LocalServer, rounds: int) -> list[float]:
    from twinkle_client import TwinkleClient
    from twinkle_client.model import MultiLoraTransformersModel

    times = []
    with TwinkleClient(server.url, server.keys[-1]) as client:
        for i in range(rounds):
            start = time.perf_counter()
            model = MultiLoraTransformersModel(client=client)
            model.add_adapter_to_model("default", LORA)
            model.set_optimizer("AdamW", lr=1e-3)
            model.forward_backward(BATCH)
            model.step()
            model.save(f"churn-{i}")
            model.remove_adapter()
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=12, help="forward_backward calls per tenant")
    parser.add_argument("--churn-rounds", type=int, default=5)
    args = parser.parse_args()
    levels = (1, 4, 16)

    with tempfile.TemporaryDirectory() as home:
        tenants = max(levels)
        server = LocalServer(
            Path(home), [f"tenant-{i}" for i in range(tenants + 1)], max_loras=tenants + 1
        )
        try:
            rows = []
            for n in levels:  # interleaved: the VM's load drifts between measurements
                base_ms = statistics.median(in_process(args.calls, 4)) * 1e3
                rows.append((n, base_ms, *over_http(server, n, args.calls)))
            churn_times = churn(server, args.churn_rounds)
        finally:
            server.stop()

    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()} · commit {commit()}\n"
    )
    print(
        "forward_backward on bundled://tiny-qwen3, batch 4 x 32 tokens, LoRA r=8. In process: "
        "the median call just before each row. Overhead: a call's latency minus the time its "
        "work ran on the server's worker (HTTP, JSON, auth, store, and the queue wait).\n"
    )
    print(
        "| tenants | calls | in-process ms | calls/s | vs in process | p50 ms | p99 ms "
        "| server work p50 ms | overhead p50 ms |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, base_ms, latencies, computes, throughput in rows:
        p50, p99 = _pct(latencies, 0.5) * 1e3, _pct(latencies, 0.99) * 1e3
        overhead = statistics.median(x - c for x, c in zip(latencies, computes, strict=True))
        print(
            f"| {n} | {len(latencies)} | {base_ms:.1f} | {throughput:.1f} "
            f"| {throughput * base_ms / 1e3:.2f}x | {p50:.1f} | {p99:.1f} "
            f"| {_pct(computes, 0.5) * 1e3:.1f} | {overhead * 1e3:.1f} |"
        )
    print(
        f"\nLoRA slot churn (create, set_optimizer, 1 step, save, release), median of "
        f"{len(churn_times)}: {statistics.median(churn_times) * 1e3:.0f} ms "
        f"(min {min(churn_times) * 1e3:.0f}, max {max(churn_times) * 1e3:.0f})"
    )


if __name__ == "__main__":
    main()
