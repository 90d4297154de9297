r"""twinkle-server's OpenAI endpoint: time to first token and tokens/s against the sampler
called in process.

    python benchmarks/bench_openai.py            # about 2 minutes on 2 CPU cores

Baseline: ``TorchSampler.sample`` in this process on the tiny model (one thread, as the
server's process gets), a 32-token prompt, ``ignore_eos`` so every completion has exactly
``max_tokens`` tokens. Its time to first token is a ``max_tokens=1`` call (prefill and one
step); its tokens/s is ``max_tokens`` over a full call. Measured: ``POST /v1/completions``
on a real server process on 127.0.0.1 with the same prompt tokens, streamed (time to the
first chunk holding a token, and tokens over the time to ``[DONE]``) and not streamed.
The server's TorchSampler streams each token as it is drawn, so the streamed time to first
token is the prefill and one step plus HTTP; a sampler that returns whole completions would
show the full completion's latency there. Rows interleave in-process and HTTP calls;
medians.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from local_server import LocalServer  # noqa: E402
from provenance import commit  # noqa: E402

MODEL = "bundled://tiny-qwen3"
PROMPT = [(7 * i + 3) % 1000 + 10 for i in range(32)]


def in_process_sampler():
    import torch

    from twinkle.sampler import TorchSampler

    torch.set_num_threads(1)
    return TorchSampler(MODEL, device="cpu", seed=0)


def sample_in_process(sampler, max_tokens: int) -> float:
    from twinkle.data_format import InputFeature, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, seed=1, ignore_eos=True)
    start = time.perf_counter()
    sampler.sample([InputFeature(input_ids=PROMPT)], params)
    return time.perf_counter() - start


def over_http(http: httpx.Client, max_tokens: int, stream: bool) -> tuple[float, float, int]:
    """(seconds to the first token, seconds to the end, tokens) of one completion."""
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "seed": 1,
        "ignore_eos": True,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
    }
    start = time.perf_counter()
    if not stream:
        answer = http.post("/v1/completions", json=body)
        answer.raise_for_status()
        done = time.perf_counter() - start
        return done, done, answer.json()["usage"]["completion_tokens"]
    first, tokens = None, 0
    with http.stream("POST", "/v1/completions", json=body) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and first is None:
                first = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return first, time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[16, 64])
    args = parser.parse_args()
    sampler = in_process_sampler()
    rows = []
    with tempfile.TemporaryDirectory() as home:
        server = LocalServer(Path(home), ["bench"], 1, sampler_max_tokens=max(args.max_tokens))
        headers = {"Authorization": f"Bearer {server.keys[0]}"}
        try:
            with httpx.Client(base_url=server.url, headers=headers, timeout=300) as http:
                for n in args.max_tokens:
                    for _ in range(2):  # warm-up both sides
                        sample_in_process(sampler, n)
                        over_http(http, n, stream=True)
                    local_first, local_full, streamed, whole = [], [], [], []
                    for _ in range(args.repeats):
                        local_first.append(sample_in_process(sampler, 1))
                        local_full.append(sample_in_process(sampler, n))
                        streamed.append(over_http(http, n, stream=True))
                        whole.append(over_http(http, n, stream=False))
                    rows.append((n, local_first, local_full, streamed, whole))
        finally:
            server.stop()

    med = statistics.median
    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()} · commit {commit()}\n"
    )
    print(
        f"{MODEL}, 32-token prompt, ignore_eos, one completion, medians of {args.repeats}. "
        "TTFT in process: a max_tokens=1 call; over HTTP: the first streamed token chunk.\n"
    )
    print(
        "| max_tokens | in-process TTFT ms | stream TTFT ms | TTFT ratio | in-process tok/s "
        "| stream tok/s | non-stream tok/s | tok/s ratio (non-stream) |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, local_first, local_full, streamed, whole in rows:
        assert all(tokens == n for _, _, tokens in streamed + whole), "a completion ended early"
        ttft_local, ttft_http = med(local_first) * 1e3, med(s[0] for s in streamed) * 1e3
        rate_local = n / med(local_full)
        rate_stream = n / med(s[1] for s in streamed)
        rate_whole = n / med(w[1] for w in whole)
        print(
            f"| {n} | {ttft_local:.1f} | {ttft_http:.1f} | {ttft_http / ttft_local:.1f}x "
            f"| {rate_local:.0f} | {rate_stream:.0f} | {rate_whole:.0f} "
            f"| {rate_whole / rate_local:.2f}x |"
        )


if __name__ == "__main__":
    main()
