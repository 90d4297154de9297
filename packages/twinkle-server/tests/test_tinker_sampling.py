"""Tinker's sampling routes in process: sessions, asample's submit answer, results read back
with the SDK's own decoder, prompt logprobs against the model, stops, checkpoints, and the
user errors."""

from __future__ import annotations

import math

import pytest
import torch
from fastapi.testclient import TestClient
from tinker.proto.response_conv import deserialize_sample_response

from twinkle.server.app import create_app
from twinkle.server.auth import create_key
from twinkle.server.config import ServerConfig
from twinkle.server.state import build_state

PROTO = {"Accept": "application/x-protobuf"}
PROMPT = [5, 17, 42, 9, 88, 3, 61]


class Client:
    def __init__(self, http: TestClient, key: str) -> None:
        self.http, self.headers = http, {"X-API-Key": key}
        self.session = self.post("/create_session", {}).json()["session_id"]

    def post(self, path, body, headers=None):
        headers = {**self.headers, **(headers or {})}
        return self.http.post(f"/api/v1{path}", json=body, headers=headers)

    def sampler(self, seq: int, **target) -> str:
        body = {"session_id": self.session, "sampling_session_seq_id": seq, **target}
        response = self.post("/create_sampling_session", body)
        assert response.status_code == 200, response.text
        return response.json()["sampling_session_id"]

    def submit(self, sampler_id: str, **extra):
        body = {
            "sampling_session_id": sampler_id,
            "seq_id": 0,
            "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
            "sampling_params": {"max_tokens": 4, "seed": 3},
            **extra,
        }
        return self.post("/asample", body)

    def result(self, request_id: str, proto: bool = True):
        response = self.post(
            "/retrieve_future", {"request_id": request_id}, PROTO if proto else None
        )
        assert response.status_code == 200, response.text
        if proto:
            assert response.headers["content-type"] == "application/x-protobuf"
            return deserialize_sample_response(response.content)
        return response.json()

    def sample(self, sampler_id: str, **extra):
        submitted = self.submit(sampler_id, **extra)
        assert submitted.status_code == 200, submitted.text
        return self.result(submitted.json()["request_id"])


@pytest.fixture(scope="module")
def sampling_server(tmp_path_factory):
    """Its own in-process server: the shared one has no sampler."""
    config = ServerConfig.model_validate(
        {
            "model": {"model_id": "bundled://tiny-qwen3", "max_loras": 2, "device": "cpu"},
            "sampler": {"enabled": True, "kind": "torch", "max_tokens": 64},
            "storage": {"home": str(tmp_path_factory.mktemp("home"))},
        }
    )
    state = build_state(config)
    keys = [create_key(state.store, name)[0] for name in ("alice", "bob")]
    with TestClient(create_app(state), raise_server_exceptions=False) as http:
        yield state, Client(http, keys[0]), Client(http, keys[1])
    state.close()


def direct_prompt_logprobs(model: torch.nn.Module, prompt: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0].float()
    logps = logits[:-1].log_softmax(-1).gather(-1, torch.tensor(prompt[1:])[:, None])[:, 0]
    return logps.tolist()


def test_asample_answers_sequence_ids_and_a_protobuf_result(sampling_server):
    state, alice, _ = sampling_server
    base = state.model.base_model
    sampler_id = alice.sampler(0, base_model=base)
    assert sampler_id == f"{alice.session}:sample:0"
    info = alice.http.get(f"/api/v1/samplers/{sampler_id}", headers=alice.headers).json()
    assert info == {"sampler_id": sampler_id, "base_model": base, "model_path": None}
    submitted = alice.submit(sampler_id, num_samples=3)
    assert submitted.status_code == 200, submitted.text
    answer = submitted.json()
    assert len(answer["sample_sequence_ids"]) == 3 == len(set(answer["sample_sequence_ids"]))
    response = alice.result(answer["request_id"])
    assert len(response.sequences) == 3
    for seq in response.sequences:
        assert 1 <= len(seq.tokens) <= 4 and len(seq.logprobs) == len(seq.tokens)
        assert all(lp <= 0 for lp in seq.logprobs)
        assert seq.stop_reason in ("stop", "length")
    legacy = alice.result(answer["request_id"], proto=False)  # SDK 0.16.1 reads JSON
    assert [s["tokens"] for s in legacy["sequences"]] == [s.tokens for s in response.sequences]


def test_compute_logprobs_scores_the_prompt_like_the_model(sampling_server):
    state, alice, _ = sampling_server
    sampler_id = alice.sampler(1, base_model=state.model.base_model)
    response = alice.sample(
        sampler_id, prompt_logprobs=True, topk_prompt_logprobs=3, sampling_params={"max_tokens": 1}
    )
    scores = response.prompt_logprobs
    assert scores[0] is None and len(scores) == len(PROMPT)
    expected = direct_prompt_logprobs(state.sampler.sampler.model, PROMPT)
    assert scores[1:] == pytest.approx(expected, abs=1e-5)  # float32, same weights
    topk = response.topk_prompt_logprobs
    assert topk[0] is None and all(len(row) == 3 for row in topk[1:])
    assert all(row[0][1] >= row[1][1] >= row[2][1] for row in topk[1:])
    assert all(row[0][1] >= lp - 1e-6 for row, lp in zip(topk[1:], scores[1:], strict=True))


def test_stop_tokens_end_a_sample_and_an_empty_stop_list_runs_to_max_tokens(sampling_server):
    state, alice, _ = sampling_server
    sampler_id = alice.sampler(2, base_model=state.model.base_model)
    params = {"max_tokens": 6, "seed": 11, "temperature": 1.0}
    free = alice.sample(sampler_id, sampling_params=params).sequences[0]
    stop_at = free.tokens[1]
    stopped = alice.sample(sampler_id, sampling_params={**params, "stop": [stop_at]})
    stopped = stopped.sequences[0]
    assert stopped.tokens == free.tokens[: free.tokens.index(stop_at) + 1]
    assert stopped.stop_reason == "stop"
    never = {**params, "stop": ["\u2603 never \u2603"]}  # a stop string that does not occur
    assert alice.sample(sampler_id, sampling_params=never).sequences[0].tokens == free.tokens
    forever = alice.sample(sampler_id, sampling_params={**params, "stop": []}).sequences[0]
    assert len(forever.tokens) == 6 and forever.stop_reason == "length"
    topk = alice.sample(sampler_id, sampling_params=params, topk_sample_logprobs=2).sequences[0]
    assert topk.tokens == free.tokens and len(topk.topk_logprobs) == len(free.tokens)


def test_a_saved_checkpoint_samples_with_its_own_weights(sampling_server, make_tenant, feature):
    state, alice, _ = sampling_server
    tenant = make_tenant(alice.http, alice.headers["X-API-Key"])
    run = tenant.new_run()
    tenant.ok(run, "set_optimizer", optimizer_cls="AdamW", lr=5e-2)
    for _ in range(3):
        tenant.ok(run, "forward_backward", inputs=[feature])
        tenant.ok(run, "step")
        tenant.ok(run, "zero_grad")
    uri = tenant.ok(run, "save", name="s1")
    model_path = uri.replace("twinkle://", "tinker://")
    sampler_id = alice.sampler(3, model_path=model_path)
    info = alice.http.get(f"/api/v1/samplers/{sampler_id}", headers=alice.headers).json()
    assert info["model_path"] == model_path
    scored = {"prompt_logprobs": True, "sampling_params": {"max_tokens": 1}}
    tuned = alice.sample(sampler_id, **scored).prompt_logprobs[1:]
    base = alice.sample(alice.sampler(4, base_model=state.model.base_model), **scored)
    trainer = state.model.model
    trainer.model.set_adapter(state.model.live[run].adapter)
    expected = direct_prompt_logprobs(trainer.model, PROMPT)
    assert tuned == pytest.approx(expected, abs=1e-4)  # sampler copy vs trainer, float32
    assert max(abs(a - b) for a, b in zip(tuned, base.prompt_logprobs[1:], strict=True)) > 1e-3


@pytest.mark.parametrize(
    "extra, status, message",
    [
        ({"prompt_alt_tokens_k": 2}, 400, "prompt_alt_tokens_k"),
        ({"prompt_logprobs_last_n": 1, "prompt_logprobs": True}, 400, "prompt_logprobs_last_n"),
        ({"record_stability_info": True}, 400, "record_stability_info"),
        ({"target_prompt_logprobs": {"data": [1], "dtype": "int64"}}, 400, "target_prompt"),
        ({"prompt": {"chunks": [{"type": "image", "data": "", "format": "png"}]}}, 400, "text"),
        ({"prompt": {"chunks": [{"tokens": [10**9]}]}}, 400, "vocabulary"),
        ({"sampling_params": {"max_tokens": 10**6}}, 413, "max_tokens"),
        ({"sampling_params": {"max_tokens": 2, "top_p": 0}}, 400, "top_p"),
        ({"sampling_params": {"max_tokens": 2, "beam_width": 4}}, 400, "beam_width"),
        ({"num_samples": 0}, 400, "num_samples"),
    ],
)
def test_unsupported_or_malformed_requests_are_user_errors(sampling_server, extra, status, message):
    state, alice, _ = sampling_server
    sampler_id = alice.sampler(10, base_model=state.model.base_model)
    response = alice.submit(sampler_id, **extra)
    assert response.status_code == status, response.text
    body = response.json()
    assert body["category"] == "user" and message in body["error"]


def test_another_key_cannot_use_or_see_a_sampler(sampling_server):
    state, alice, bob = sampling_server
    sampler_id = alice.sampler(20, base_model=state.model.base_model)
    assert bob.submit(sampler_id).status_code == 404
    assert bob.http.get(f"/api/v1/samplers/{sampler_id}", headers=bob.headers).status_code == 404
    other = {"session_id": alice.session, "sampling_session_seq_id": 1, "base_model": "x"}
    assert bob.post("/create_sampling_session", other).status_code == 404  # alice's session
    wrong_model = {**other, "session_id": bob.session}
    assert bob.post("/create_sampling_session", wrong_model).status_code == 400
    assert alice.submit(f"{alice.session}:sample:999").status_code == 404


def test_a_resubmit_with_the_same_idempotency_key_gets_the_same_future(sampling_server):
    state, alice, _ = sampling_server
    sampler_id = alice.sampler(30, base_model=state.model.base_model)
    body = {
        "sampling_session_id": sampler_id,
        "prompt": {"chunks": [{"tokens": PROMPT}]},  # 0.16.1: no chunk type, defaults unset
        "sampling_params": {"max_tokens": 2},
    }
    headers = {"X-Idempotency-Key": "retry-1"}
    first = alice.post("/asample", body, headers).json()
    second = alice.post("/asample", body, headers).json()
    assert first == second
    result = alice.result(first["request_id"], proto=False)
    assert len(result["sequences"]) == 1 and not any(
        math.isnan(lp) for lp in result["sequences"][0]["logprobs"]
    )


def test_a_server_without_a_sampler_says_so_with_a_user_error(server):
    state, http, keys = server  # the shared in-process server: sampler disabled
    client = Client(http, keys["alice"])
    body = {"session_id": client.session, "sampling_session_seq_id": 0, "base_model": "x"}
    response = client.post("/create_sampling_session", body)
    assert response.status_code == 400 and response.json()["category"] == "user"
    assert "sampler" in response.json()["error"]


class RecordingSampler:
    """Stands in for a sampler: records which adapter each load and sample used."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, float]] = []
        self.sampled_with: list[str] = []

    def set_template(self, name, **kwargs) -> None:
        pass

    def load_lora(self, name, config, weights) -> None:
        self.loads.append((name, float(weights["w"][0])))

    def sample(self, batch, params, adapter_name=None, num_samples=None):
        self.sampled_with.append(adapter_name)
        return [None]


def test_the_adapter_cache_reuses_slots_and_reloads_rewritten_folders(tmp_path):
    import json
    import os

    from safetensors.torch import save_file

    from twinkle.data_format import SamplingParams
    from twinkle.sampler import BASE_MODEL
    from twinkle.server.sampler_service import SamplerService

    def write(folder, value: float, mtime_ns: int) -> str:
        folder.mkdir(exist_ok=True)
        (folder / "adapter_config.json").write_text(json.dumps({"r": 1}))
        weights = folder / "adapter_model.safetensors"
        save_file({"w": torch.tensor([value])}, str(weights))
        os.utime(weights, ns=(mtime_ns, mtime_ns))
        return str(folder)

    config = ServerConfig.model_validate(
        {"sampler": {"enabled": True, "max_cached_adapters": 2}, "storage": {"home": str(tmp_path)}}
    )
    fake = RecordingSampler()
    service = SamplerService(config, model_service=None, sampler=fake)
    a, b, c = (write(tmp_path / n, v, 10**9) for n, v in (("a", 1.0), ("b", 2.0), ("c", 3.0)))
    params = SamplingParams(max_tokens=1)
    for folder in (a, b, a, c, None):
        service.sample_tokens([1, 2], params, folder)()
    # a and b fill the two slots; a is cached; c evicts b (least recent) and takes its slot.
    assert fake.loads == [("ckpt0", 1.0), ("ckpt1", 2.0), ("ckpt1", 3.0)]
    assert fake.sampled_with == ["ckpt0", "ckpt1", "ckpt0", "ckpt1", BASE_MODEL]
    write(tmp_path / "a", 4.0, 2 * 10**9)  # rewritten in place: loaded again, same slot
    service.sample_tokens([1, 2], params, a)()
    assert fake.loads[-1] == ("ckpt0", 4.0)
    service.stop()


def test_unseeded_asample_follows_the_tenants_own_calls(sampling_server):
    """An asample without a seed takes one from the key's own generator: a tenant's samples
    are the same whether or not another tenant sampled in between."""
    state, alice, bob = sampling_server

    def tokens(client) -> list[int]:
        sampler = client.sampler(90 + len(calls), base_model="bundled://tiny-qwen3")
        params = {"max_tokens": 8, "temperature": 1.0}
        calls.append(client)
        return list(client.sample(sampler, sampling_params=params).sequences[0].tokens)

    calls: list = []
    alice_id = state.principal(alice.headers["X-API-Key"]).key_id
    state.sampler._seed_streams.pop(alice_id, None)  # her stream from its start
    alone = [tokens(alice), tokens(alice)]
    assert alone[0] != alone[1]  # successive unseeded calls differ
    state.sampler._seed_streams.pop(alice_id)  # and from its start again
    crowded = [tokens(alice), tokens(bob), tokens(bob), tokens(alice)]
    assert [crowded[0], crowded[3]] == alone
