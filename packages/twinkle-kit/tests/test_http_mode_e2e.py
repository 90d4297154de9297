"""HTTP mode end to end: the documents' server.py (cookbook/server/server.py, which calls
``twinkle.initialize(mode='http', groups=...)`` and ``twinkle.server.launch``) serves the tiny
model through Ray Serve on a local CPU Ray cluster, with the model and the sampler on their own
device groups; the Twinkle client trains and samples against it, and SIGTERM stops it cleanly.
The server runs as a process of its own (it owns its Ray cluster)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from twinkle_client import TwinkleClient
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.sampler import vLLMSampler

SERVER_SCRIPT = Path(__file__).resolve().parents[3] / "cookbook" / "server" / "server.py"
MODEL_ID = "bundled://tiny-qwen3"
SFT_BATCH = [
    {"input_ids": [1, 2, 3, 4, 5, 6, 7], "labels": [-100, -100, 3, 4, 5, 6, 7]},
    {"input_ids": [9, 8, 7, 6, 5], "labels": [-100, 8, 7, 6, 5]},
]
STREAMED_TOKENS = 256  # a completion whose drawing takes longer than its request
PROMPTS = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in range(2)]


@pytest.fixture(scope="module")
def served(server_process):
    server = server_process("home", ray=True)  # no config: the script serves the tiny model
    key = server.cli("keys", "create", "--name", "sft")
    server.start(
        [sys.executable, str(SERVER_SCRIPT), "--port", str(server.port)], timeout_s=300, poll_s=1.0
    )
    yield {
        "url": server.url,
        "key": key,
        "home": server.home,
        "proc": server.proc,
        "log": server.log,
    }
    server.stop(timeout_s=90)


def test_the_client_trains_and_samples_through_ray_serve(served):
    health = httpx.get(f"{served['url']}/api/v1/healthz", timeout=10)
    assert health.json() == {"status": "ok"}
    assert "x-request-id" in health.headers  # answered through Serve's proxy, not uvicorn alone

    with TwinkleClient(served["url"], served["key"]) as client:
        model = MultiLoraTransformersModel(model_id=MODEL_ID, client=client)
        model.add_adapter_to_model("default", {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0})
        model.set_optimizer("AdamW", lr=1e-2)
        losses = []
        for _ in range(3):
            losses.append(float(model.forward_backward(inputs=SFT_BATCH).loss))
            model.clip_grad_norm(1.0)
            model.step()
            model.zero_grad()
        assert losses[-1] < losses[0], losses
        path = model.save("over-http")
        assert path.startswith("twinkle://") and path.endswith("/weights/over-http")
        assert list(served["home"].glob("checkpoints/*/*/weights/over-http/*.safetensors"))

        sampler = vLLMSampler(MODEL_ID, client=client)
        params = {"max_tokens": 4, "seed": 7}
        first = sampler.sample(PROMPTS, params, num_samples=2)["sequences"]
        again = sampler.sample(PROMPTS, params, num_samples=2)["sequences"]
        assert len(first) == 4 and all(1 <= len(seq.tokens) <= 4 for seq in first)
        assert [s.tokens for s in first] == [s.tokens for s in again]  # seeded: reproducible
        tuned = sampler.sample(PROMPTS[:1], params, adapter_uri=path)["sequences"]
        assert len(tuned) == 1


def test_the_openai_stream_arrives_token_by_token_through_serves_proxy(served):
    """Serve's proxy passes the ingress's StreamingResponse on as it is written: the first
    chunk arrives long before the whole completion could have been drawn, not with the
    rest at the end. The same request unstreamed first, both to warm the sampler (its first
    call pays for loading) and to time a whole completion. The completion is long enough
    (STREAMED_TOKENS) that drawing it, not the request's fixed cost through the proxy, sets
    its time, on a loaded machine too (at 32 tokens the two were equal)."""
    client = openai.OpenAI(base_url=f"{served['url']}/v1", api_key=served["key"], max_retries=0)
    request = {
        "model": MODEL_ID,
        "prompt": [5, 17, 42],
        "max_tokens": STREAMED_TOKENS,
        "extra_body": {"ignore_eos": True},
    }
    start = time.perf_counter()
    whole = client.completions.create(**request)
    whole_s = time.perf_counter() - start
    assert whole.usage.completion_tokens == STREAMED_TOKENS
    warm = stream_arrivals(client, request)  # the first stream pays one-time start-up costs
    assert len(warm) == STREAMED_TOKENS + 1
    arrivals, finishes = stream_arrivals(client, request, finishes=[])
    # A chunk per token, then the finish.
    assert len(arrivals) == STREAMED_TOKENS + 1 and finishes[-1] == "length"
    # Buffered by the proxy, the first chunk would come with the last, after a whole
    # completion's time.
    assert arrivals[0] < whole_s / 2, (whole_s, arrivals)
    assert arrivals[0] < arrivals[-1] / 2, arrivals


def stream_arrivals(client, request: dict, finishes: list | None = None):
    """Seconds from the request to each chunk of its stream (and each finish_reason)."""
    arrivals, start = [], time.perf_counter()
    for chunk in client.completions.create(**request, stream=True):
        arrivals.append(time.perf_counter() - start)
        if finishes is not None:
            finishes.append(chunk.choices[0].finish_reason)
    return arrivals if finishes is None else (arrivals, finishes)


def test_sigterm_stops_the_service_and_releases_its_groups(served):
    proc = served["proc"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=90) == 0
    log = served["log"].read_text()
    assert "its device groups are released" in log, log[-3000:]
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{served['url']}/api/v1/healthz", timeout=2)
