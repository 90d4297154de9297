"""The server in front of vLLMSampler, on a stand-in of vLLM's engine interface (the root
conftest's ``fake_vllm``; the real engine: ``benchmarks/gpu/check_openai_vllm_gpu.py``): an
OpenAI stream hears each token while the engine is still drawing the completion, its pieces
add up to the whole answer, a trained adapter is sampled through a LoRARequest, and a prompt
the engine refuses is a 400 naming the limit."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from twinkle.server import sampler_service
from twinkle.server.app import create_app
from twinkle.server.auth import create_key
from twinkle.server.config import ServerConfig
from twinkle.server.openai.live_stream import LiveStream
from twinkle.server.state import build_state

BASE = "bundled://tiny-qwen3"
FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}


@pytest.fixture(scope="module")
def served(tmp_path_factory, fake_vllm, make_tenant):
    build = sampler_service.build_sampler
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sampler_service, "build_sampler", lambda c: fake_vllm(build, c))
        yield from _serve(tmp_path_factory.mktemp("home"), make_tenant)


def _serve(home, make_tenant):
    config = ServerConfig.model_validate(
        {
            "model": {"model_id": BASE, "max_loras": 2, "device": "cpu"},
            "sampler": {
                "enabled": True,
                "kind": "vllm",
                "max_tokens": 32,
                "engine_args": {"max_model_len": 40},
            },
            "storage": {"home": str(home)},
        }
    )
    state = build_state(config)
    key = create_key(state.store, "alice")[0]
    with TestClient(create_app(state), raise_server_exceptions=False) as http:
        yield state, make_tenant(http, key)
    state.close()


def _completions(tenant, body):
    auth = {"Authorization": f"Bearer {tenant.key}"}
    return tenant.http.post("/v1/completions", json=body, headers=auth)


def test_a_stream_hears_tokens_while_the_engine_draws_them(served, monkeypatch):
    state, alice = served
    engine = state.sampler.sampler.engine.llm_engine
    assert state.sampler.streams_tokens
    heard: list[bool] = []  # per token: whether the engine still had the request running
    listener = LiveStream.listener

    def recording(self, prompt):
        heard_token = listener(self, prompt)

        def heard_while_drawing(row, token, pairs):
            heard.append(engine.has_unfinished_requests())
            heard_token(row, token, pairs)

        return heard_while_drawing

    monkeypatch.setattr(LiveStream, "listener", recording)
    body = {"model": BASE, "prompt": [5, 17, 42], "max_tokens": 10, "seed": 2, "n": 2}
    whole = _completions(alice, body)
    assert whole.status_code == 200, whole.text
    streamed = _completions(alice, {**body, "stream": True})
    assert streamed.status_code == 200, streamed.text
    events = [line[6:] for line in streamed.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    texts = {0: "", 1: ""}
    for event in events[:-1]:
        for choice in json.loads(event)["choices"]:
            texts[choice["index"]] += choice["text"]
    assert [texts[0], texts[1]] == [c["text"] for c in whole.json()["choices"]]
    assert texts[0] != texts[1]
    assert len(heard) == whole.json()["usage"]["completion_tokens"] == 20
    assert all(heard[:-2])  # every token but each choice's last reached the stream mid-draw


def test_a_trained_adapter_is_sampled_through_its_lora_request(served):
    state, alice = served
    run = alice.new_run()
    alice.ok(run, "set_optimizer", optimizer_cls="AdamW", lr=5e-2)
    alice.ok(run, "forward_backward", inputs=[FEATURE])
    alice.ok(run, "step")
    uri = alice.ok(run, "save", name="s1", kind="sampler_weights", save_optimizer=False)
    answer = _completions(alice, {"model": uri, "prompt": "hi", "max_tokens": 4})
    assert answer.status_code == 200, answer.text
    lora = state.sampler.sampler.engine.llm_engine.lora_seen[-1]
    assert lora is not None and lora.lora_name.startswith("ckpt")
    base = _completions(alice, {"model": BASE, "prompt": "hi", "max_tokens": 4, "seed": 1})
    assert base.status_code == 200 and state.sampler.sampler.engine.llm_engine.lora_seen[-1] is None


def test_a_prompt_longer_than_the_engine_takes_is_a_400(served):
    _, alice = served
    answer = _completions(alice, {"model": BASE, "prompt": list(range(10, 60)), "max_tokens": 2})
    assert answer.status_code == 400, answer.text
    assert "maximum model length of 40" in answer.json()["error"]["message"]
    assert _completions(alice, {"model": BASE, "prompt": [5], "max_tokens": 2}).status_code == 200
