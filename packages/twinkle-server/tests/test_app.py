"""The service in process: training through the routes, tenant isolation, bad inputs.

Every bad input must get a 4xx with a JSON body naming a category, never a 500 or a
traceback, and the server must keep serving the other tenant afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}


@pytest.fixture(scope="module")
def tenants(server, make_tenant):
    state, http, keys = server
    return make_tenant(http, keys["alice"]), make_tenant(http, keys["bob"])


@pytest.fixture(scope="module")
def alice_run(tenants):
    alice, _ = tenants
    run = alice.new_run()
    alice.ok(run, "set_optimizer", optimizer_cls="AdamW", lr=1e-2)
    for _ in range(2):
        alice.ok(run, "forward_backward", inputs=[FEATURE, FEATURE])
        alice.ok(run, "clip_grad_norm", max_norm=1.0)
        alice.ok(run, "step")
        alice.ok(run, "zero_grad")
    uri = alice.ok(run, "save", name="first")
    return run, uri


def test_training_through_the_routes_lowers_the_loss(tenants):
    alice, _ = tenants
    run = alice.new_run()
    alice.ok(run, "set_optimizer", optimizer_cls="AdamW", lr=1e-2)
    losses = []
    for _ in range(4):
        losses.append(alice.ok(run, "forward_backward", inputs=[FEATURE])["loss"])
        alice.ok(run, "step")
        alice.ok(run, "zero_grad")
    assert losses[-1] < losses[0] - 0.1
    alice.ok(run, "save", name="tmp")
    assert alice.post("/twinkle/model/remove_adapter", {"training_run_id": run}).status_code == 200


def test_runs_and_checkpoints_are_listed_to_their_owner(tenants, alice_run):
    alice, _ = tenants
    run, uri = alice_run
    assert uri == f"twinkle://{run}/weights/first"
    listed = alice.get("/training_runs").json()
    assert run in [r["training_run_id"] for r in listed["training_runs"]]
    checkpoints = alice.get(f"/training_runs/{run}/checkpoints").json()["checkpoints"]
    assert [c["twinkle_path"] for c in checkpoints] == [uri]
    assert alice.get(f"/training_runs/{run}").json()["last_checkpoint"]["twinkle_path"] == uri


def test_another_tenant_sees_nothing_of_alices(tenants, alice_run):
    alice, bob = tenants
    run, uri = alice_run
    bob_run = bob.new_run()
    assert run not in [
        r["training_run_id"] for r in bob.get("/training_runs").json()["training_runs"]
    ]
    assert bob.get("/checkpoints").json()["checkpoints"] == []
    attempts = [
        bob.get(f"/training_runs/{run}"),
        bob.get(f"/training_runs/{run}/checkpoints"),
        bob.delete(f"/training_runs/{run}/checkpoints/weights/first"),
        bob.call(run, "forward_backward", inputs=[FEATURE]),
        bob.call(run, "save", name="stolen"),
        bob.call(bob_run, "load", path=uri),
        bob.call(bob_run, "resume_from_checkpoint", path=uri),
        bob.post("/weights_info", {"twinkle_path": uri}),
        bob.post("/twinkle/model/remove_adapter", {"training_run_id": run}),
    ]
    for response in attempts:
        assert response.status_code == 404, response.text
        assert response.json()["category"] == "user"
    # Alice's checkpoint is intact and still hers.
    assert (
        alice.get(f"/training_runs/{run}/checkpoints").json()["checkpoints"][0]["twinkle_path"]
        == uri
    )


def test_one_checkpoint_answers_its_folder_to_its_owner_only(tenants, alice_run):
    alice, bob = tenants
    run, uri = alice_run
    answer = alice.get(f"/training_runs/{run}/checkpoints/weights/first")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["twinkle_path"] == uri and body["checkpoint_id"] == "weights/first"
    assert (Path(body["path"]) / "adapter_model.safetensors").is_file()
    assert bob.get(f"/training_runs/{run}/checkpoints/weights/first").status_code == 404
    _assert_json_error(alice.get(f"/training_runs/{run}/checkpoints/weights/missing"), 404)
    _assert_json_error(alice.get(f"/training_runs/{run}/checkpoints/bogus/first"), 400)
    downloads = alice.get(f"/training_runs/{run}/checkpoints/weights/first/external_weights_urls")
    _assert_json_error(downloads, 400)
    assert "is not external weights" in downloads.json()["error"]
    _assert_json_error(alice.post("/weights_info", {}), 400)
    info = alice.post("/weights_info", {"twinkle_path": uri}).json()
    assert (info["is_lora"], info["lora_rank"]) == (True, 4)


def test_a_sessions_metadata_is_stored_and_returned(tenants):
    alice, bob = tenants
    created = alice.post("/create_session", {"user_metadata": {"user": "alice", "n": 1}})
    assert created.json()["user_metadata"] == {"user": "alice", "n": 1}
    session = created.json()["session_id"]
    assert alice.get(f"/sessions/{session}").json()["user_metadata"] == {"user": "alice", "n": 1}
    assert bob.get(f"/sessions/{session}").status_code == 404
    _assert_json_error(alice.post("/create_session", {"user_metadata": ["alice"]}), 400)


def test_load_restores_the_saved_adapter(tenants, alice_run):
    alice, _ = tenants
    run, uri = alice_run
    before = alice.ok(run, "forward_only", inputs=[FEATURE])["loss"]
    alice.ok(run, "forward_backward", inputs=[FEATURE])
    alice.ok(run, "step")
    alice.ok(run, "zero_grad")
    moved = alice.ok(run, "forward_only", inputs=[FEATURE])["loss"]
    fresh = alice.new_run()
    alice.ok(fresh, "load", path=uri)
    restored = alice.ok(fresh, "forward_only", inputs=[FEATURE])["loss"]
    assert moved != pytest.approx(before, abs=1e-6)
    assert restored == pytest.approx(before, abs=1e-6)
    alice.post("/twinkle/model/remove_adapter", {"training_run_id": fresh})


def test_a_retry_with_the_same_idempotency_key_runs_once(tenants):
    _, bob = tenants
    run = bob.new_run()
    bob.ok(run, "set_optimizer", optimizer_cls="SGD", lr=0.1)
    headers = {**bob.headers, "X-Idempotency-Key": "fb-1"}
    body = {"training_run_id": run, "args": {"inputs": [FEATURE]}}
    first = bob.http.post("/api/v1/twinkle/model/forward_backward", json=body, headers=headers)
    again = bob.http.post("/api/v1/twinkle/model/forward_backward", json=body, headers=headers)
    assert first.json()["request_id"] == again.json()["request_id"]
    assert first.json()["result"] == again.json()["result"]
    assert "compute_ms" in first.json() and "compute_ms" not in again.json()
    metrics = bob.ok(run, "calculate_metric")
    assert metrics["tokens"] == 6.0  # one batch of 6 tokens, not two
    bob.post("/twinkle/model/remove_adapter", {"training_run_id": run})


def _assert_json_error(response, status):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) >= {"error", "category"} and body["category"] in ("user", "server")
    assert "Traceback" not in response.text and 'File "' not in response.text


def test_bad_inputs_get_json_4xx_and_the_server_keeps_serving(server, tenants, alice_run):
    state, http, keys = server
    alice, _ = tenants
    run, _ = alice_run
    url = "/api/v1/twinkle/model/forward_backward"
    cases = [
        (http.post(url, content=b"{not json", headers=alice.headers), 400),
        (alice.call(run, "forward_backward", inputs="not a list"), 400),
        (alice.call(run, "forward_backward", inputs=[{"input_ids": "abc"}]), 400),
        (alice.call(run, "forward_backward", inputs=[{"input_ids": [1, 2], "labels": [1]}]), 400),
        (alice.post("/twinkle/model/step", {"training_run_id": 7}), 400),
        (alice.post("/twinkle/model/step", {"training_run_id": "sess-x:train:9"}), 404),
        (alice.call(run, "no_such_method"), 400),
        (alice.call(run, "set_loss", loss="UnknownLoss"), 400),
        (alice.call(run, "set_loss", loss="builtins.eval"), 400),
        (alice.call(run, "set_optimizer", optimizer_cls="AdamW", lr={"x": 1}), 400),
        (alice.call(run, "set_template", template="Template", trust_remote_code=True), 400),
        (alice.call(run, "set_template", template="Template", chat_template="{{ x }}"), 400),
        (alice.call(run, "save", name="../../escape"), 400),
        (alice.call(run, "save", name="/etc/cron.d/x"), 400),
        (alice.call(run, "load", path="/tmp/elsewhere"), 400),
        (alice.call(run, "load", path=f"twinkle://{run}/weights/missing"), 404),
        (http.post(url, content=b"x" * 70_000, headers=alice.headers), 413),
        (
            alice.post(
                "/twinkle/model/add_adapter_to_model",
                {"session_id": alice.session, "config": {"r": 64}},
            ),
            400,
        ),
        (
            alice.post(
                "/twinkle/model/add_adapter_to_model",
                {"session_id": alice.session, "config": {"modules_to_save": ["lm_head"]}},
            ),
            400,
        ),
        (
            alice.post(
                "/twinkle/model/add_adapter_to_model",
                {"session_id": alice.session, "model_id": "ms://Qwen/Qwen3.5-4B"},
            ),
            400,
        ),
        (http.get("/api/v1/training_runs"), 401),
        (http.get("/api/v1/training_runs", headers={"X-API-Key": "tml-forged"}), 401),
    ]
    for response, status in cases:
        _assert_json_error(response, status)
    assert alice.ok(run, "forward_only", inputs=[FEATURE])["loss"] > 0


def test_a_revoked_key_is_refused_at_once(server, make_tenant):
    state, http, keys = server
    mallory = make_tenant(http, keys["mallory"])
    assert mallory.get("/training_runs").status_code == 200
    state.store.revoke_key("mallory", 1.0)
    _assert_json_error(mallory.get("/training_runs"), 401)


def test_the_pool_is_bounded_and_a_finished_session_frees_its_slots(server, make_tenant):
    state, http, keys = server
    extra = make_tenant(http, keys["bob"])
    held = state.model.slots_held(extra.key_id())
    state.config.limits.max_loras_per_key = held
    try:
        body = {"session_id": extra.session, "config": {"r": 2}}
        _assert_json_error(extra.post("/twinkle/model/add_adapter_to_model", body), 403)
        state.config.limits.max_loras_per_key = state.config.model.max_loras  # the whole pool
        runs = []
        while state.model.free_slots() > 0:
            runs.append(extra.new_run())
        _assert_json_error(extra.post("/twinkle/model/add_adapter_to_model", body), 503)
    finally:
        state.config.limits.max_loras_per_key = None
    assert extra.post(f"/sessions/{extra.session}/finish", {}).status_code == 200
    for _ in range(50):
        if state.model.free_slots() >= len(runs):
            break
        time.sleep(0.1)
    assert state.model.free_slots() >= len(runs)
    _assert_json_error(extra.call(runs[0], "step"), 409)
    _assert_json_error(extra.post("/session_heartbeat", {"session_id": extra.session}), 410)


def test_a_session_without_heartbeats_expires_and_frees_its_slot(server, make_tenant):
    state, http, keys = server
    quiet = make_tenant(http, keys["alice"])
    run = quiet.new_run()
    assert run in state.model.live
    state.sessions.ttl_s = 0.0  # every open session is now overdue
    try:
        state.reap_sessions()
    finally:
        state.sessions.ttl_s = 120.0
    for _ in range(50):
        if run not in state.model.live:
            break
        time.sleep(0.1)
    assert run not in state.model.live and not state.model.live
    _assert_json_error(quiet.call(run, "step"), 409)
    assert quiet.get(f"/training_runs/{run}").json()["active"] is False


def test_healthz_needs_no_key_and_the_api_table_names_the_model_methods(tenants, server):
    _, http, _ = server
    alice, _ = tenants
    assert http.get("/api/v1/healthz").json() == {"status": "ok"}
    table = alice.get("/twinkle/api").json()
    assert table["model"]["forward_backward"][0] == "inputs"
    assert "add_adapter_to_model" in table["model"] and "sample" in table["sampler"]


def test_server_side_datasets_are_allow_listed_bounded_and_private(tenants):
    alice, bob = tenants
    _assert_json_error(
        alice.post("/twinkle/dataset/create", {"dataset_meta": {"dataset_id": "/etc/passwd"}}), 400
    )
    meta = {"dataset_id": "bundled://self-cognition", "data_slice": [0, 4]}
    created = alice.post("/twinkle/dataset/create", {"dataset_meta": meta})
    assert created.status_code == 200, created.text
    dataset_id = created.json()["result"]
    forked = {
        "dataset_id": dataset_id,
        "args": {"preprocessor": "SelfCognitionProcessor", "num_proc": 64},
    }
    _assert_json_error(alice.post("/twinkle/dataset/map", forked), 400)
    _assert_json_error(bob.post("/twinkle/dataset/len", {"dataset_id": dataset_id}), 404)
    assert alice.post("/twinkle/dataset/len", {"dataset_id": dataset_id}).json()["result"] == 4
