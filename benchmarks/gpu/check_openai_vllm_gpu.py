"""The OpenAI endpoint in front of vLLMSampler on one CUDA GPU: the check a CPU cannot make.

The CPU tests run every route with TorchSampler in process and in a real server process
(``packages/twinkle-server/tests/test_openai_routes.py``, ``test_served_process.py``).
Here a server process samples with ``sampler.kind: vllm`` on the bundled tiny model: one
tenant trains a step and saves sampler weights, then the official ``openai`` client asks the
base model and that adapter for chat and text completions (``n=2``, logprobs, a stop
string, a stream that must add up to the whole answer), the other tenant must get 404 for the
adapter, and time to first token and tokens/s of a 64-token stream are printed. vLLMSampler
runs its requests on the engine step by step (``RequestOutputKind.DELTA``), so a stream's
first chunk must come well before its last: the check fails when the median time to the
first token is over half the stream's time (chunks sent once the completion is done).

    python benchmarks/gpu/check_openai_vllm_gpu.py

Refuses to run without a CUDA GPU and vLLM (the ``vllm`` extra). About two minutes.
``--sampler torch`` runs the same script with TorchSampler on a CPU (a dry run of
everything but vLLM).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

BASE = "bundled://tiny-qwen3"
FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}


def start(home: Path, kind: str) -> tuple[subprocess.Popen, str, list[str]]:
    from twinkle.server.auth import create_key
    from twinkle.server.store import SQLiteStore

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    device = "cuda" if kind == "vllm" else "cpu"
    engine = "{gpu_memory_utilization: 0.2}" if kind == "vllm" else "{}"
    (home / "config.yaml").write_text(
        f"port: {port}\nmodel: {{model_id: '{BASE}', max_loras: 2, device: {device}}}\n"
        f"sampler: {{enabled: true, kind: {kind}, max_tokens: 64, engine_args: {engine}}}\n"
        f"storage: {{home: '{home}'}}\n"
    )
    store = SQLiteStore(home / "state.db")
    keys = [create_key(store, name)[0] for name in ("alice", "bob")]
    store.close()
    log = open(home / "server.log", "wb")  # noqa: SIM115 - the child keeps it open
    proc = subprocess.Popen(
        [sys.executable, "-m", "twinkle.server", "launch", "-c", str(home / "config.yaml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "TWINKLE_HOME": str(home)},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit("the server stopped:\n" + (home / "server.log").read_text()[-3000:])
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code == 200:
                return proc, url, keys
        except httpx.TransportError:
            pass
        time.sleep(1)
    proc.kill()
    sys.exit("the server did not become ready")


def train_and_save(url: str, key: str) -> tuple[str, str]:
    http = httpx.Client(base_url=f"{url}/api/v1", headers={"X-API-Key": key}, timeout=300)

    def post(path: str, body: dict) -> dict:
        answer = http.post(path, json=body)
        answer.raise_for_status()
        return answer.json()

    session = post("/create_session", {})["session_id"]
    body = {"session_id": session, "config": {"r": 4, "target_modules": "all-linear"}}
    run = post("/twinkle/model/add_adapter_to_model", body)["result"]["training_run_id"]

    def call(method: str, **args) -> object:
        return post(f"/twinkle/model/{method}", {"training_run_id": run, "args": args})["result"]

    call("set_optimizer", optimizer_cls="AdamW", lr=5e-2)
    call("forward_backward", inputs=[FEATURE])
    call("step")
    uri = call("save", name="gpu", kind="sampler_weights", save_optimizer=False)
    return run, uri


def check(url: str, alice: str, bob: str, run: str, uri: str) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=alice, max_retries=0, timeout=300)
    ids = [m.id for m in client.models.list()]
    assert ids == [BASE, uri, f"twinkle://{run}"], ids
    messages = [{"role": "user", "content": "hello"}]
    for model in (BASE, uri, f"twinkle://{run}"):
        chat = {"model": model, "messages": messages, "max_tokens": 16, "n": 2, "seed": 3}
        whole = client.chat.completions.create(**chat, logprobs=True, top_logprobs=2)
        assert len(whole.choices) == 2
        assert whole.usage.completion_tokens == sum(len(c.logprobs.content) for c in whole.choices)
        texts = {0: "", 1: ""}
        for chunk in client.chat.completions.create(**chat, stream=True):
            for choice in chunk.choices:
                texts[choice.index] += choice.delta.content or ""
        assert [texts[0], texts[1]] == [c.message.content for c in whole.choices], (texts, whole)
    free = client.completions.create(model=uri, prompt="once", max_tokens=12, temperature=0)
    text = free.choices[0].text
    if len(text) > 4:
        stop = text[2:4]
        cut = client.completions.create(
            model=uri, prompt="once", max_tokens=12, temperature=0, stop=stop
        )
        assert cut.choices[0].text == text[: text.find(stop)], (cut, text)
    other = openai.OpenAI(base_url=f"{url}/v1", api_key=bob, max_retries=0)
    try:
        other.chat.completions.create(model=uri, messages=messages, max_tokens=2)
        raise AssertionError("bob sampled alice's adapter")
    except openai.NotFoundError:
        pass


def stream_figures(url: str, key: str, repeats: int) -> tuple[float, float, float]:
    """Medians of the time to the first token chunk (ms), tokens/s and the whole stream's
    time (ms) of a 64-token stream."""
    body = {"model": BASE, "prompt": list(range(10, 42)), "max_tokens": 64, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {key}"}
    firsts, rates, wholes = [], [], []
    for _ in range(repeats):
        start, first = time.perf_counter(), None
        with httpx.stream(
            "POST", f"{url}/v1/completions", json={**body, "stream": True}, headers=headers
        ) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: {") and first is None:
                    first = time.perf_counter() - start
        firsts.append(first * 1e3)
        wholes.append((time.perf_counter() - start) * 1e3)
        rates.append(64 / (time.perf_counter() - start))
    return statistics.median(firsts), statistics.median(rates), statistics.median(wholes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sampler", choices=("vllm", "torch"), default="vllm")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.sampler == "vllm" and not torch.cuda.is_available():
        sys.exit("this check needs a CUDA GPU; the CPU tests cover the rest")
    with tempfile.TemporaryDirectory() as home:
        proc, url, (alice, bob) = start(Path(home), args.sampler)
        try:
            run, uri = train_and_save(url, alice)
            check(url, alice, bob, run, uri)
            ttft, rate, whole = stream_figures(url, alice, args.repeats)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(
        f"OpenAI endpoint on {args.sampler}: models, chat, completions, streams, stop, isolation ok"
    )
    print(
        f"64-token stream, medians of {args.repeats}: TTFT {ttft:.1f} ms of {whole:.1f} ms, "
        f"{rate:.0f} tokens/s"
    )
    if ttft > whole / 2:
        sys.exit("the first chunk came after half the stream: tokens are not streamed as drawn")


if __name__ == "__main__":
    main()
