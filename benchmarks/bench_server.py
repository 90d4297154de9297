r"""twinkle-server: tenants batched into one pass against serial scheduling; sampling several
adapters in one batch; LoRA slot churn.

    python benchmarks/bench_server.py            # about 4 minutes on 2 CPU cores

1. In process: the same requests (each tenant's batch of 4 x 32 tokens, LoRA r=8) run as
   ``MultiLoraTransformersModel.forward_backward`` one tenant after another (what the
   server's worker did) against one ``forward_backward_many`` pass of all of them.
2. Over HTTP: two real server processes on 127.0.0.1, one with ``model.batching`` on and
   one with it off (today's serial scheduling), each tenant a thread with its own key,
   session and adapter, sending its next forward_backward when the last answers. Training
   tokens/s is the tokens of every answered call over the wall time; p50/p99 the calls'
   latency; pass the mean number of requests in the pass that ran a call.
3. Sampling: TorchSampler holding 8 adapters, 8 calls (one per adapter) sampled one at a
   time against ``sample_many`` of all 8 in one batch.

Every measurement alternates its two arms, several times (the VM's load drifts); the tables
show medians. Churn: create an adapter, set its optimizer, train one step, save, release.
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

ROWS, WIDTH = 4, 32
LORA = {"r": 8, "target_modules": "all-linear", "lora_dropout": 0.0}
LEVELS = (1, 4, 8, 16)


def tenant_batch(tenant: int) -> list[dict]:
    """A tenant's own rows (its token ids differ from the others')."""
    rows = []
    for row in range(ROWS):
        ids = [1 + (tenant * 97 + row * 31 + i * 7) % 3000 for i in range(WIDTH)]
        rows.append({"input_ids": ids, "labels": [-100] * 8 + ids[8:]})
    return rows


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- 1. in process ---------------------------------------------------------------------------


def in_process(levels: tuple[int, ...], repeats: int) -> list[tuple[int, float, float]]:
    """Per level: median tokens/s serial and batched."""
    from peft import LoraConfig

    from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel
    from twinkle.model.transformers.tenant_pass import TenantRequest

    model = MultiLoraTransformersModel("bundled://tiny-qwen3", max_loras=max(levels), device="cpu")
    names = [f"tenant{i}" for i in range(max(levels))]
    for name in names:
        model.add_adapter_to_model(name, LoraConfig(**LORA))
        model.set_optimizer("AdamW", lr=1e-4, adapter_name=name)
    batches = {name: tenant_batch(i) for i, name in enumerate(names)}
    rows = []
    for n in levels:
        requests = [TenantRequest(name, batches[name]) for name in names[:n]]
        serial, batched = [], []
        for rep in range(repeats + 1):  # the first round warms up
            start = time.perf_counter()
            for request in requests:
                model.forward_backward(request.inputs, adapter_name=request.adapter_name)
            middle = time.perf_counter()
            model.forward_backward_many(requests)
            end = time.perf_counter()
            if rep:
                serial.append(middle - start)
                batched.append(end - middle)
            for name in names[:n]:
                model.zero_grad(adapter_name=name)
        tokens = n * ROWS * WIDTH
        rows.append((n, tokens / statistics.median(serial), tokens / statistics.median(batched)))
    return rows


# ---- 2. over HTTP ----------------------------------------------------------------------------


class HttpTenant:
    def __init__(self, url: str, key: str, index: int) -> None:
        from twinkle_client import TwinkleClient
        from twinkle_client.model import MultiLoraTransformersModel

        self.client = TwinkleClient(url, key)
        model = MultiLoraTransformersModel(client=self.client)
        model.add_adapter_to_model("default", LORA)
        args = {"inputs": tenant_batch(index)}
        self.body = {"training_run_id": model.training_run_id(), "args": args}
        self.call()  # warm-up

    def call(self) -> dict:
        return self.client.transport.request("POST", "/twinkle/model/forward_backward", self.body)


def closed_loop(tenants: list[HttpTenant], calls: int) -> tuple[float, list[float], float]:
    """Every tenant sends ``calls`` calls, each after the last answered: tokens/s, the
    calls' latencies and the mean pass size."""
    latencies: list[float] = []
    passes: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(tenants) + 1)

    def run(tenant: HttpTenant) -> None:
        barrier.wait()
        mine, sizes = [], []
        for _ in range(calls):
            start = time.perf_counter()
            answer = tenant.call()
            mine.append(time.perf_counter() - start)
            sizes.append(answer.get("pass_size", 1))
        with lock:
            latencies.extend(mine)
            passes.extend(sizes)

    threads = [threading.Thread(target=run, args=(t,)) for t in tenants]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    return len(latencies) * ROWS * WIDTH / wall, latencies, statistics.mean(passes)


def over_http(levels: tuple[int, ...], calls: int, repeats: int) -> list[tuple]:
    most = max(levels)
    with tempfile.TemporaryDirectory() as serial_home, tempfile.TemporaryDirectory() as home:
        keys = [f"tenant-{i}" for i in range(most)]
        servers = {
            "serial": LocalServer(Path(serial_home), keys, max_loras=most, batching=False),
            "batched": LocalServer(Path(home), keys, max_loras=most, batching=True),
        }
        try:
            tenants = {
                arm: [HttpTenant(server.url, key, i) for i, key in enumerate(server.keys)]
                for arm, server in servers.items()
            }
            rows = []
            for n in levels:
                measured: dict[str, list] = {"serial": [], "batched": []}
                for _ in range(repeats):  # interleaved: the VM's load drifts
                    for arm in ("serial", "batched"):
                        measured[arm].append(closed_loop(tenants[arm][:n], calls))
                rows.append((n, measured))
            for arm_tenants in tenants.values():
                for tenant in arm_tenants:
                    tenant.client.close()
            churn_times = churn(servers["batched"], rounds=5)
        finally:
            for server in servers.values():
                server.stop()
    return rows, churn_times


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
            model.forward_backward(tenant_batch(0))
            model.step()
            model.save(f"churn-{i}")
            model.remove_adapter()
            times.append(time.perf_counter() - start)
    return times


# ---- 3. sampling -----------------------------------------------------------------------------


def sampling(adapters: int, repeats: int, max_tokens: int) -> tuple[float, float]:
    """Median sampled tokens/s: one call at a time, and all calls in one batch."""
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    from twinkle.data_format import SamplingParams
    from twinkle.model.transformers.loading import load_causal_lm
    from twinkle.sampler import TorchSampler
    from twinkle.sampler.base import SampleRequest

    sampler = TorchSampler("bundled://tiny-qwen3", device="cpu")
    sampler.set_template("Qwen3_5Template")
    lora = LoraConfig(r=8, target_modules="all-linear", init_lora_weights=False)
    for i in range(adapters):
        donor, _ = load_causal_lm("bundled://tiny-qwen3", None, None, 0)
        torch.manual_seed(i)
        donor = get_peft_model(donor, lora)
        sampler.load_lora(f"a{i}", lora.to_dict(), get_peft_model_state_dict(donor))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    prompts = [{"messages": [{"role": "user", "content": f"Count to {i}."}]} for i in range(2)]
    requests = [
        SampleRequest(prompts, params.model_copy(update={"seed": i}), f"a{i}", 2)
        for i in range(adapters)
    ]
    tokens = adapters * len(prompts) * 2 * max_tokens
    alone, together = [], []
    for rep in range(repeats + 1):
        start = time.perf_counter()
        for request in requests:
            sampler.sample_many([request])
        middle = time.perf_counter()
        sampler.sample_many(requests)
        end = time.perf_counter()
        if rep:
            alone.append(middle - start)
            together.append(end - middle)
    return tokens / statistics.median(alone), tokens / statistics.median(together)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=8, help="forward_backward calls per tenant")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds per arm")
    parser.add_argument("--sample-tokens", type=int, default=16)
    args = parser.parse_args()

    local = in_process(LEVELS, args.repeats + 2)
    http_rows, churn_times = over_http(LEVELS, args.calls, args.repeats)
    sample_alone, sample_together = sampling(8, args.repeats + 2, args.sample_tokens)

    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()} · commit {commit()}\n"
    )
    print(
        f"forward_backward on bundled://tiny-qwen3, each tenant {ROWS} x {WIDTH} tokens, "
        f"LoRA r=8 all-linear. Training tokens/s (input tokens), medians.\n"
    )
    print("In process, serial forward_backward calls against one forward_backward_many:\n")
    print("| tenants | serial tok/s | batched tok/s | batched / serial |")
    print("| ---: | ---: | ---: | ---: |")
    for n, serial, batched in local:
        print(f"| {n} | {serial:,.0f} | {batched:,.0f} | {batched / serial:.2f}x |")
    print(
        f"\nOver HTTP, {args.calls} calls per tenant, {args.repeats} interleaved rounds "
        "(p50/p99 over all rounds' calls):\n"
    )
    print(
        "| tenants | serial tok/s | batched tok/s | batched / serial | serial p50 / p99 ms "
        "| batched p50 / p99 ms | mean pass |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, measured in http_rows:
        figures = {}
        for arm, runs in measured.items():
            latencies = [x for _, lat, _ in runs for x in lat]
            figures[arm] = (
                statistics.median(t for t, _, _ in runs),
                _pct(latencies, 0.5) * 1e3,
                _pct(latencies, 0.99) * 1e3,
                statistics.median(p for _, _, p in runs),
            )
        s, b = figures["serial"], figures["batched"]
        print(
            f"| {n} | {s[0]:,.0f} | {b[0]:,.0f} | {b[0] / s[0]:.2f}x | {s[1]:.0f} / {s[2]:.0f} "
            f"| {b[1]:.0f} / {b[2]:.0f} | {b[3]:.1f} |"
        )
    print(
        f"\nSampling, TorchSampler with 8 adapters (r=8), 8 calls of 2 prompts x 2 samples x "
        f"{args.sample_tokens} tokens: one call at a time {sample_alone:,.0f} tok/s, all in "
        f"one batch {sample_together:,.0f} tok/s ({sample_together / sample_alone:.2f}x)"
    )
    print(
        f"\nLoRA slot churn (create, set_optimizer, 1 step, save, release), median of "
        f"{len(churn_times)}: {statistics.median(churn_times) * 1e3:.0f} ms "
        f"(min {min(churn_times) * 1e3:.0f}, max {max(churn_times) * 1e3:.0f})"
    )


if __name__ == "__main__":
    main()
