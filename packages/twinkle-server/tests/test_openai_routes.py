"""The OpenAI-compatible routes in process: what they sample equals the sampler called
directly, a stream's pieces add up to the answer, `model` resolution and isolation, and every
bad input a 4xx naming the field. (The official client against a real server process:
test_served_process.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from twinkle.data_format import SamplingParams
from twinkle.server.app import create_app
from twinkle.server.auth import create_key
from twinkle.server.config import ServerConfig
from twinkle.server.openai.routes import template_for
from twinkle.server.state import build_state

FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}
BASE = "bundled://tiny-qwen3"
TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error"}


@pytest.fixture(scope="module")
def served(tmp_path_factory, make_tenant):
    config = ServerConfig.model_validate(
        {
            "model": {"model_id": BASE, "max_loras": 2, "device": "cpu"},
            "sampler": {"enabled": True, "kind": "torch", "max_tokens": 32},
            "storage": {"home": str(tmp_path_factory.mktemp("home"))},
        }
    )
    state = build_state(config)
    keys = [create_key(state.store, name)[0] for name in ("alice", "bob")]
    with TestClient(create_app(state), raise_server_exceptions=False) as http:
        alice, bob = make_tenant(http, keys[0]), make_tenant(http, keys[1])
        run = alice.new_run()
        alice.ok(run, "set_optimizer", optimizer_cls="AdamW", lr=5e-2)
        alice.ok(run, "forward_backward", inputs=[FEATURE])
        alice.ok(run, "step")
        uri = alice.ok(run, "save", name="s1", kind="sampler_weights", save_optimizer=False)
        yield state, alice, bob, run, uri
    state.close()


def _v1(tenant, path, body=None):
    if body is None:
        return tenant.http.get(f"/v1{path}", headers={"Authorization": f"Bearer {tenant.key}"})
    return tenant.http.post(
        f"/v1{path}", json=body, headers={"Authorization": f"Bearer {tenant.key}"}
    )


def test_models_lists_the_base_model_and_only_the_callers_adapters(served):
    _, alice, bob, run, uri = served
    ids = [m["id"] for m in _v1(alice, "/models").json()["data"]]
    assert ids == [BASE, uri, f"twinkle://{run}"]
    assert [m["id"] for m in _v1(bob, "/models").json()["data"]] == [BASE]
    assert _v1(alice, f"/models/{uri}").json()["id"] == uri
    assert _v1(bob, f"/models/{uri}").status_code == 404


def test_an_expired_checkpoint_is_neither_listed_nor_served_before_the_reaper_runs(served):
    state, alice, _, run, uri = served
    record = state.store.list_checkpoints(alice.key_id(), run)[0]
    key = (alice.key_id(), record.run_id, record.kind, record.name)
    state.store.set_checkpoint_expiry(*key, expires_at=time.time() - 1)
    try:
        assert [m["id"] for m in _v1(alice, "/models").json()["data"]] == [BASE]
        assert _v1(alice, f"/models/{uri}").status_code == 404
        assert _v1(alice, f"/models/twinkle://{run}").status_code == 404
    finally:
        state.store.set_checkpoint_expiry(*key, expires_at=None)
    assert [m["id"] for m in _v1(alice, "/models").json()["data"]] == [
        BASE,
        uri,
        f"twinkle://{run}",
    ]


def test_a_completion_is_what_the_sampler_gives_for_the_same_tokens_and_seed(served):
    state, alice, _, _, uri = served
    prompt = "hello there"
    body = {"model": uri, "prompt": prompt, "max_tokens": 6, "seed": 11, "logprobs": 2}
    answer = _v1(alice, "/completions", body).json()
    tokenizer = template_for(BASE).tokenizer
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    folder = state.model.owned_checkpoint(alice.http.app.state.twinkle.principal(alice.key), uri)
    direct = state.sampler.worker.submit(
        "test",
        state.sampler.sample_tokens(
            ids, SamplingParams(max_tokens=6, seed=11, logprobs=2), folder.path
        ),
    ).result()
    sequence = direct.sequences[0]
    choice = answer["choices"][0]
    assert choice["text"] == sequence.text
    assert choice["logprobs"]["token_logprobs"] == [pairs[0][1] for pairs in sequence.logprobs]
    assert all(len(top) <= 2 for top in choice["logprobs"]["top_logprobs"])
    assert answer["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": len(sequence.tokens),
        "total_tokens": len(ids) + len(sequence.tokens),
    }
    usage = {u.metric: u.amount for u in state.store.usage(alice.key_id())}
    assert usage["sampled_tokens"] >= len(sequence.tokens) and usage["prompt_tokens"] >= len(ids)
    base = _v1(alice, "/completions", {**body, "model": BASE}).json()["choices"][0]
    assert base["logprobs"]["token_logprobs"] != choice["logprobs"]["token_logprobs"]


def test_a_chat_stream_adds_up_to_the_whole_answer(served):
    _, alice, _, run, _ = served
    body = {
        "model": f"twinkle://{run}",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "seed": 5,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 1,
    }
    whole = _v1(alice, "/chat/completions", body).json()
    streamed = _v1(
        alice,
        "/chat/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in streamed.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts, finish = {0: "", 1: ""}, {}
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["delta"].get("content", "")
            if choice["finish_reason"]:
                finish[choice["index"]] = choice["finish_reason"]
    assert [texts[i] for i in (0, 1)] == [c["message"]["content"] for c in whole["choices"]]
    assert [finish[i] for i in (0, 1)] == [c["finish_reason"] for c in whole["choices"]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert whole["usage"]["prompt_tokens"] == 2 * len(
        template_for(BASE)
        .encode({"messages": body["messages"]}, add_generation_prompt=True)
        .input_ids
    )


def test_a_stop_string_ends_the_text_before_it(served):
    _, alice, _, _, _ = served
    body = {"model": BASE, "prompt": [5, 17, 42], "max_tokens": 12, "seed": 1, "temperature": 0}
    free = _v1(alice, "/completions", body).json()["choices"][0]["text"]
    stop = free[3:5]
    stopped = _v1(alice, "/completions", {**body, "stop": stop}).json()["choices"][0]
    assert stopped["text"] == free[: free.find(stop)] and stopped["finish_reason"] == "stop"
    forced = _v1(alice, "/completions", {**body, "ignore_eos": True}).json()  # vLLM's extension
    assert (
        forced["usage"]["completion_tokens"] == 12
        and forced["choices"][0]["finish_reason"] == "length"
    )


@pytest.mark.parametrize(
    "change, status, words",
    [
        ({"temperature": 3}, 400, "temperature must be a finite number in [0, 2]"),
        ({"top_p": 0}, 400, "top_p"),
        ({"n": 0}, 400, "n must be a positive int"),
        ({"n": 10_000}, 413, "max_num_samples"),
        ({"prompt": ["hi"] * 17, "n": 64}, 413, "1088 completions (17 prompts × 64 each)"),
        ({"max_tokens": 0}, 400, "max_tokens must be an int"),
        ({"max_tokens": 10_000}, 413, "exceeds this server's limit, 32"),
        ({"stop": 7}, 400, "stop must be a string or a list of strings"),
        ({"logprobs": 50}, 400, "logprobs must be an int in [0, 20]"),
        ({"tools": [{"type": "function"}]}, 400, "does not implement tools"),
        ({"stream": "yes"}, 400, "stream must be true or false"),
        ({"stream_options": {"include_usage": "x"}}, 400, "include_usage must be true or false"),
        ({"prompt": []}, 400, "prompt must be a non-empty"),
        ({"prompt": [[1, 2], 3]}, 400, "prompt must be a non-empty"),
        ({"prompt": [10**9]}, 400, "token id outside"),
        ({"model": "gpt-4o"}, 404, "is not served here"),
        ({"model": None}, 400, "needs 'model'"),
    ],
)
def test_bad_completions_are_a_4xx_naming_the_field(served, change, status, words):
    _, alice, _, _, _ = served
    body = {"model": BASE, "prompt": "hi", "max_tokens": 2, **change}
    answer = _v1(alice, "/completions", body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert words in error["message"] and error["type"] == TYPES[status], error


def test_another_keys_adapter_is_a_404_like_a_missing_one(served):
    _, alice, bob, run, uri = served
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for model in (uri, f"twinkle://{run}", uri.replace("s1", "nope")):
        answer = _v1(bob, "/chat/completions", {**chat, "model": model})
        assert answer.status_code == 404, answer.text
    missing = _v1(alice, "/chat/completions", {**chat, "model": uri.replace("s1", "nope")})
    assert missing.status_code == 404


@pytest.mark.parametrize(
    "messages, words",
    [
        ([], "messages must be a non-empty list"),
        ([{"role": "wizard", "content": "hi"}], "needs a role"),
        ([{"role": "user", "content": 5}], "content must be a string"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], "only text parts"),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "last message"),
    ],
)
def test_bad_chat_messages_are_a_400(served, messages, words):
    _, alice, _, _, _ = served
    answer = _v1(alice, "/chat/completions", {"model": BASE, "messages": messages})
    assert answer.status_code == 400 and words in answer.json()["error"]["message"], answer.text


def test_no_key_is_a_401_in_openais_error_shape(served):
    _, alice, _, _, _ = served
    answer = alice.http.get("/v1/models")
    assert answer.status_code == 401
    assert answer.json()["error"]["type"] == "authentication_error"
    assert answer.json()["request_id"] == answer.headers["x-request-id"]


def test_unseeded_prompts_each_draw_their_own_seed(served):
    _, alice, _, _, _ = served
    body = {"model": BASE, "prompt": ["same words", "same words"], "max_tokens": 6}
    choices = _v1(alice, "/completions", body).json()["choices"]
    assert len(choices) == 2 and choices[0]["text"] != choices[1]["text"]
    seeded = _v1(alice, "/completions", {**body, "seed": 9}).json()["choices"]
    assert seeded[0]["text"] == seeded[1]["text"]


def _streamed_text(answer) -> tuple[str, str]:
    events = [line[6:] for line in answer.text.split("\n\n") if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    return text, [c for c in chunks if c["choices"]][-1]["choices"][0]["finish_reason"]


def test_a_live_stream_never_sends_a_stop_string_and_adds_up(served):
    state, alice, _, _, _ = served
    assert state.sampler.streams_tokens  # TorchSampler in this process: tokens as drawn
    body = {"model": BASE, "prompt": [5, 17, 42], "max_tokens": 12, "seed": 1, "temperature": 0}
    free = _v1(alice, "/completions", body).json()["choices"][0]["text"]
    for stop in (free[3:5], free[6:7]):
        whole = _v1(alice, "/completions", {**body, "stop": stop}).json()["choices"][0]
        streamed = _v1(alice, "/completions", {**body, "stop": stop, "stream": True})
        assert _streamed_text(streamed) == (whole["text"], whole["finish_reason"])
        assert stop not in whole["text"]


def test_a_stream_whose_sample_fails_before_a_token_is_answered_as_the_failure(served):
    state, alice, _, run, _ = served
    uri = alice.ok(run, "save", name="doomed", kind="sampler_weights", save_optimizer=False)
    record = state.model.owned_checkpoint(state.principal(alice.key), uri)
    (Path(record.path) / "adapter_model.safetensors").unlink()
    body = {"model": uri, "prompt": "hi", "max_tokens": 4, "stream": True}
    answer = _v1(alice, "/completions", body)
    assert answer.status_code == 404, answer.text
    assert "no longer exists" in answer.json()["error"]["message"]


def test_a_failure_after_the_first_token_ends_the_stream_with_an_error_event():
    import asyncio
    from concurrent.futures import Future

    from twinkle.server.errors import BadRequest
    from twinkle.server.openai.answers import Answer
    from twinkle.server.openai.live_stream import DONE, LiveStream

    async def run() -> list[str]:
        stream = LiveStream(asyncio.get_running_loop(), 1)
        failed: Future = Future()
        failed.set_exception(BadRequest("the sampler refused"))
        events = stream.events(
            (0, 42, [(42, -1.0)]),
            failed,
            Answer("cmpl-1", 0, BASE, False),
            template_for(BASE).tokenizer,
            None,
            (),
            lambda responses: iter(()),
        )
        stream.queue.put_nowait(DONE)  # the work ended (failed) after its first token
        return [event async for event in events]

    token, error = asyncio.run(run())
    assert json.loads(token[6:])["choices"][0]["index"] == 0
    body = json.loads(error[6:])
    assert body["error"]["message"] == "the sampler refused"
    assert body["error"]["type"] == "invalid_request_error"
