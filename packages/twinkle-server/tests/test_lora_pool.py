"""The LoRA pool between tenants, through the in-process server: one tenant's departure does
not break the next one's save, a key holds at most its quota (on the Twinkle and the Tinker
routes alike), /capacity shows a key its own slots only, and a tenant's dropout is its own
(its losses do not depend on a neighbour's training, nor on its own resume), as are its
unseeded samples."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient

from twinkle.server.app import create_app
from twinkle.server.auth import create_key
from twinkle.server.config import ServerConfig
from twinkle.server.state import build_state

FEATURES = [
    {"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "labels": [-100, -100, 3, 4, 5, 6, 7, 8]},
    {"input_ids": [8, 7, 6, 5, 4, 3], "labels": [-100, 7, 6, 5, 4, 3]},
]


def _run(tenant, dropout: float = 0.0) -> str:
    body = {
        "session_id": tenant.session,
        "adapter_name": "default",
        "config": {"r": 4, "target_modules": "all-linear", "lora_dropout": dropout},
    }
    response = tenant.post("/twinkle/model/add_adapter_to_model", body)
    assert response.status_code == 200, response.text
    run = response.json()["result"]["training_run_id"]
    tenant.ok(run, "set_optimizer", optimizer_cls="AdamW", lr=1e-2)
    return run


def _remove(tenant, run: str) -> None:
    response = tenant.post("/twinkle/model/remove_adapter", {"training_run_id": run})
    assert response.status_code == 200, response.text


def _train(tenant, run: str) -> float:
    loss = tenant.ok(run, "forward_backward", inputs=FEATURES)["loss"]
    tenant.ok(run, "clip_grad_and_step")
    return loss


def _still_serves(tenant, run: str) -> float:
    """A normal request after the case: answered, with a finite loss."""
    loss = tenant.ok(run, "forward_only", inputs=FEATURES)["loss"]
    assert math.isfinite(loss)
    return loss


def test_after_the_pool_empties_the_next_tenants_first_save_works(server, make_tenant):
    state, http, keys = server
    alice, bob = make_tenant(http, keys["alice"]), make_tenant(http, keys["bob"])
    gone = _run(alice)
    _train(alice, gone)
    _remove(alice, gone)
    assert not state.model.live
    run = _run(bob)
    before = _still_serves(bob, run)
    path = bob.ok(run, "save", name="first")  # was a 500 (KeyError in peft)
    assert path.startswith("twinkle://") and bob.ok(run, "save", name="again")
    assert _still_serves(bob, run) == before  # saving left the adapter as it was
    bob.ok(run, "load", path=path)
    assert _still_serves(bob, run) == before
    _remove(bob, run)


def test_a_tenants_dropout_is_its_own_through_its_resume(server, make_tenant):
    state, http, keys = server
    alice, bob = make_tenant(http, keys["alice"]), make_tenant(http, keys["bob"])
    mine, neighbour = _run(alice, dropout=0.1), _run(bob, dropout=0.1)
    _train(alice, mine)
    path = alice.ok(mine, "save", name="step-1")
    alone = [_train(alice, mine) for _ in range(3)]
    alice.ok(mine, "resume_from_checkpoint", path=path)
    crowded = []
    for _ in range(3):
        _train(bob, neighbour)
        crowded.append(_train(alice, mine))
    assert crowded == alone  # bit for bit: B's passes and A's resume drew from other streams
    _still_serves(alice, mine)
    _still_serves(bob, neighbour)
    _remove(alice, mine)
    _remove(bob, neighbour)


def test_a_key_holds_at_most_its_fair_share_and_sees_only_its_own(server, make_tenant):
    state, http, keys = server
    alice, bob = make_tenant(http, keys["alice"]), make_tenant(http, keys["bob"])
    assert state.config.limits.max_loras_per_key is None  # the default: ceil(3 / 2)
    runs = [_run(alice), _run(alice)]
    refused = alice.post(
        "/twinkle/model/add_adapter_to_model",
        {"session_id": alice.session, "config": {"r": 2}},
    )
    assert refused.status_code == 403, refused.text
    message = refused.json()["error"]
    assert "holds 2 LoRA slots" in message and "max_loras_per_key) is 2" in message, message
    assert alice.get("/capacity").json() == {
        "max_loras": 3,
        "used_loras": 2,
        "free_loras": 1,
        "max_loras_per_key": 2,
    }
    assert bob.get("/capacity").json()["used_loras"] == 0  # alice's slots are not shown to bob
    # The Tinker route takes its slot from the same pool, under the same quota.
    body = {
        "session_id": alice.session,
        "model_seq_id": 100,  # past the Twinkle runs of this session (same id scheme)
        "base_model": "bundled://tiny-qwen3",
        "lora_config": {"rank": 4},
    }
    submitted = alice.post("/create_model", body)
    assert submitted.status_code == 200, submitted.text
    future = http.post(
        "/api/v1/retrieve_future",
        json={"request_id": submitted.json()["request_id"]},
        headers=alice.headers,
    ).json()
    assert future.get("category") == "user" and "max_loras_per_key" in future["error"], future
    # Bob still gets the last slot, and the pool then refuses everyone as full.
    theirs = _run(bob)
    assert bob.get("/capacity").json()["free_loras"] == 0
    full = bob.post(
        "/twinkle/model/add_adapter_to_model", {"session_id": bob.session, "config": {"r": 2}}
    )
    assert full.status_code == 503 and "LoRA slots are in use" in full.json()["error"]
    for run in runs:
        _still_serves(alice, run)
        _remove(alice, run)
    _still_serves(bob, theirs)
    _remove(bob, theirs)


@pytest.fixture(scope="module")
def sampling_server(tmp_path_factory):
    """Its own in-process server: the shared one has no sampler."""
    config = ServerConfig.model_validate(
        {
            "model": {"model_id": "bundled://tiny-qwen3", "max_loras": 2, "device": "cpu"},
            "sampler": {"enabled": True, "kind": "torch", "max_tokens": 16},
            "storage": {"home": str(tmp_path_factory.mktemp("home"))},
        }
    )
    state = build_state(config)
    keys = {name: create_key(state.store, name) for name in ("alice", "bob")}
    with TestClient(create_app(state), raise_server_exceptions=False) as http:
        yield state, http, keys
    state.close()


def test_a_tenants_unseeded_samples_do_not_depend_on_its_neighbours(sampling_server):
    state, http, keys = sampling_server

    def sample(name: str) -> list[list[int]]:
        body = {
            "inputs": [{"input_ids": [1, 2, 3, 4]}],
            "sampling_params": {"max_tokens": 8, "temperature": 1.0},
            "num_samples": 2,
        }
        headers = {"X-API-Key": keys[name][0]}
        response = http.post("/api/v1/twinkle/sampler/sample", json=body, headers=headers)
        assert response.status_code == 200, response.text
        return [seq["tokens"] for seq in response.json()["result"]["sequences"]]

    alone = [sample("alice"), sample("alice")]
    assert alone[0] != alone[1]  # successive unseeded calls differ
    del state.sampler._seed_streams[keys["alice"][1].id]  # alice starts her stream again
    crowded = [sample("alice"), sample("bob"), sample("bob"), sample("alice")]
    assert [crowded[0], crowded[3]] == alone
