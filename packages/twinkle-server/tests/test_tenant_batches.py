"""Runs' forward_backward requests over HTTP share one pass; a bad one fails alone."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from twinkle.server.app import create_app
from twinkle.server.auth import create_key
from twinkle.server.config import ServerConfig
from twinkle.server.state import build_state

VOCAB = 3909  # the bundled tiny-qwen3's embedding rows
SAMPLE = "/twinkle/sampler/sample"


@pytest.fixture(scope="module")
def service(tmp_path_factory, make_tenant):
    config = {
        "model": {"model_id": "bundled://tiny-qwen3", "max_loras": 4, "device": "cpu"},
        "sampler": {"enabled": False},
        "storage": {"home": str(tmp_path_factory.mktemp("home"))},
    }
    state = build_state(ServerConfig.model_validate(config))
    keys = [create_key(state.store, name)[0] for name in ("alice", "bob", "carol")]
    with TestClient(create_app(state), raise_server_exceptions=False) as http:
        tenants = [make_tenant(http, key) for key in keys]
        yield state, tenants, [tenant.new_run() for tenant in tenants]
    state.close()


def _concurrently(state, calls) -> list:
    """Send every call while the model's worker is held, so they queue together."""
    return _concurrently_on(state.model.worker, calls)


def _concurrently_on(worker, calls) -> list:
    gate = threading.Event()
    worker.submit("hold", gate.wait)
    answers = [None] * len(calls)

    def send(i, call):
        answers[i] = call()

    threads = [threading.Thread(target=send, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while worker.pending() < len(calls) and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    for thread in threads:
        thread.join(timeout=60)
    return answers


def test_runs_share_a_pass_and_one_runs_bad_rows_fail_its_request_alone(service, feature):
    state, tenants, runs = service
    good = [feature, {"input_ids": [5, 6, 7, 8], "labels": [-100, 6, 7, 8]}]
    bad = [{"input_ids": [1, VOCAB + 7, 3], "labels": [-100, 2, 3]}]
    inputs = [good, bad, good[:1]]
    answers = _concurrently(
        state,
        [
            lambda t=t, r=r, i=i: t.call(r, "forward_backward", inputs=i)
            for t, r, i in zip(tenants, runs, inputs, strict=True)
        ],
    )
    first, refused, third = answers
    assert first.status_code == 200 and third.status_code == 200, (first.text, third.text)
    assert first.json()["pass_size"] == third.json()["pass_size"] == 3
    assert refused.status_code == 400
    assert "forward_backward" in refused.json()["error"] and str(VOCAB) in refused.json()["error"]
    # The same requests alone (no step between: the adapters are unchanged) give the same.
    for index, batch, shared in ((0, good, first), (2, good[:1], third)):
        tenant, run = tenants[index], runs[index]
        alone = tenant.ok(run, "forward_backward", inputs=batch)
        assert alone["loss"] == pytest.approx(shared.json()["result"]["loss"], rel=1e-6)
        assert alone["num_tokens"] == shared.json()["result"]["num_tokens"]
    # The refused run trains on as normal afterwards.
    after = tenants[1].ok(runs[1], "forward_backward", inputs=good)
    assert after["num_tokens"] == first.json()["result"]["num_tokens"]


def test_runs_forward_only_requests_share_a_pass_and_a_bad_one_fails_alone(service, feature):
    """Evaluation requests of three runs: one forward; the refused one a 400 naming the
    method and its problem; the others' answers those of each request alone."""
    state, tenants, runs = service
    good = [feature, {"input_ids": [5, 6, 7, 8], "labels": [-100, 6, 7, 8]}]
    bad = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}]
    bad_args = {"advantages": [1.0, 2.0]}  # two advantages for one row
    tenants[1].ok(runs[1], "set_loss", loss="GRPOLoss")
    for index in (0, 2):  # the evaluation metrics start empty
        tenants[index].ok(runs[index], "calculate_metric", is_training=False)
    try:
        answers = _concurrently(
            state,
            [
                lambda: tenants[0].call(runs[0], "forward_only", inputs=good),
                lambda: tenants[1].call(runs[1], "forward_only", inputs=bad, **bad_args),
                lambda: tenants[2].call(runs[2], "forward_only", inputs=good[1:]),
            ],
        )
    finally:
        tenants[1].ok(runs[1], "set_loss", loss="CrossEntropyLoss")
    first, refused, third = answers
    assert first.status_code == 200 and third.status_code == 200, (first.text, third.text)
    assert first.json()["pass_size"] == third.json()["pass_size"] == 3
    assert refused.status_code == 400, refused.text
    assert "forward_only" in refused.json()["error"] and "advantages" in refused.json()["error"]
    for index, batch, shared in ((0, good, first), (2, good[1:], third)):
        # the shared pass fed this run's own evaluation metrics with its own loss
        metric = tenants[index].ok(runs[index], "calculate_metric", is_training=False)
        assert metric["loss"] == pytest.approx(shared.json()["result"]["loss"], rel=1e-6)
        alone = tenants[index].ok(runs[index], "forward_only", inputs=batch)
        assert alone["loss"] == pytest.approx(shared.json()["result"]["loss"], rel=1e-6)
        assert alone["num_tokens"] == shared.json()["result"]["num_tokens"]


def test_a_call_with_micro_batch_size_runs_alone(service, feature):
    state, tenants, runs = service
    answers = _concurrently(
        state,
        [
            lambda: tenants[0].call(runs[0], "forward_backward", inputs=[feature]),
            lambda: tenants[1].call(
                runs[1], "forward_backward", inputs=[feature], micro_batch_size=1
            ),
        ],
    )
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert all("pass_size" not in a.json() for a in answers)


def test_keys_samples_from_their_checkpoints_share_one_batch(tmp_path, make_tenant, feature):
    config = {
        "model": {"model_id": "bundled://tiny-qwen3", "max_loras": 4, "device": "cpu"},
        "sampler": {"enabled": True, "kind": "torch"},
        "storage": {"home": str(tmp_path)},
    }
    state = build_state(ServerConfig.model_validate(config))
    keys = [create_key(state.store, name)[0] for name in ("alice", "bob")]
    try:
        with TestClient(create_app(state), raise_server_exceptions=False) as http:
            tenants = [make_tenant(http, key) for key in keys]
            uris = []
            for i, tenant in enumerate(tenants):  # two different adapters: a step apart
                run = tenant.new_run()
                tenant.ok(run, "set_optimizer", optimizer_cls="AdamW", lr=0.05 * (i + 1))
                tenant.ok(run, "forward_backward", inputs=[feature])
                tenant.ok(run, "step")
                uris.append(tenant.ok(run, "save", name="s"))
            bodies = [
                {
                    "inputs": [{"input_ids": [1, 2, 3, 4]}, {"input_ids": [5, 6]}],
                    "sampling_params": {"max_tokens": 5, "seed": 7 + i},
                    "adapter_uri": uri,
                }
                for i, uri in enumerate(uris)
            ]
            together = _concurrently_on(
                state.sampler.worker,
                [lambda t=t, b=b: t.post(SAMPLE, b) for t, b in zip(tenants, bodies, strict=True)],
            )
            alone = [t.post(SAMPLE, b) for t, b in zip(tenants, bodies, strict=True)]
    finally:
        state.close()
    for shared, single in zip(together, alone, strict=True):
        assert shared.status_code == 200 and single.status_code == 200, shared.text
        assert shared.json()["pass_size"] == 2 and "pass_size" not in single.json()
        tokens = [[s["tokens"] for s in r.json()["result"]["sequences"]] for r in (shared, single)]
        assert tokens[0] == tokens[1]
    assert together[0].json()["result"] != together[1].json()["result"]


def _tinker_fwdbwd(model_id: str, seq_id: int, tokens: list[int], route: str) -> dict:
    """SDK 0.16.1's JSON forward_backward (or forward) of one cross-entropy datum
    (next-token targets)."""
    datum = {
        "model_input": {"chunks": [{"tokens": tokens}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": [*tokens[1:], 1], "dtype": "int64"},
            "weights": {"data": [1.0] * len(tokens), "dtype": "float32"},
        },
    }
    body = {"data": [datum], "loss_fn": "cross_entropy"}
    return {f"{route}_input": body, "model_id": model_id, "seq_id": seq_id}


@pytest.mark.parametrize(
    ("route", "many_method"),
    [("forward_backward", "forward_backward_many"), ("forward", "forward_only_many")],
)
def test_tinker_forward_backward_of_two_runs_share_one_pass(
    tmp_path, make_tenant, monkeypatch, route, many_method
):
    config = {
        "model": {"model_id": "bundled://tiny-qwen3", "max_loras": 2, "device": "cpu"},
        "sampler": {"enabled": False},
        "storage": {"home": str(tmp_path)},
    }
    state = build_state(ServerConfig.model_validate(config))
    keys = [create_key(state.store, name)[0] for name in ("alice", "bob")]
    passes = []
    many = getattr(state.model.model, many_method)
    monkeypatch.setattr(
        state.model.model,
        many_method,
        lambda requests: passes.append(len(requests)) or many(requests),
    )
    tokens = ([5, 9, 17, 33, 2, 40], [7, 3, 8])
    try:
        with TestClient(create_app(state), raise_server_exceptions=False) as http:
            tenants = [make_tenant(http, key) for key in keys]

            def result(tenant, response):
                assert response.status_code == 200, response.text
                body = {"request_id": response.json()["request_id"]}
                answer = tenant.post("/retrieve_future", body).json()
                assert "error" not in answer, answer
                return answer

            models = []
            for tenant in tenants:
                create = {
                    "session_id": tenant.session,
                    "model_seq_id": 0,
                    "base_model": "bundled://tiny-qwen3",
                    "lora_config": {"rank": 4},
                }
                models.append(result(tenant, tenant.post("/create_model", create))["model_id"])

            def logprobs(i, seq_id, response=None):
                if response is None:
                    body = _tinker_fwdbwd(models[i], seq_id, tokens[i], route)
                    response = tenants[i].post(f"/{route}", body)
                return result(tenants[i], response)["loss_fn_outputs"][0]["logprobs"]["data"]

            gate = threading.Event()
            state.model.worker.submit("hold", gate.wait)
            sent = [
                tenants[i].post(f"/{route}", _tinker_fwdbwd(models[i], 1, tokens[i], route))
                for i in range(2)
            ]
            deadline = time.monotonic() + 30
            while state.model.worker.pending() < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            gate.set()
            together = [logprobs(i, 1, sent[i]) for i in range(2)]
            alone = [logprobs(i, 2) for i in range(2)]
    finally:
        state.close()
    assert passes == [2]  # the shared pass; the later calls each ran alone
    for got, want in zip(together, alone, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
