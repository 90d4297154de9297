"""Observability in process: request ids in answers and error bodies, /metrics counting
requests, latency, tokens per key, queues and slots, usage per key in the store, the Tinker
telemetry route stored, and the dashboard's data showing a key only its own runs. (The
dashboard page in headless Chromium: test_served_process.py.)"""

from __future__ import annotations

import re
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}
TARGET_TOKENS = 4  # the labels that are not -100


@pytest.fixture(scope="module")
def tenants(server, make_tenant):
    state, http, keys = server
    return state, make_tenant(http, keys["alice"]), make_tenant(http, keys["bob"])


def samples(http) -> dict[tuple[str, tuple], float]:
    answer = http.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def settled(http) -> dict[tuple[str, tuple], float]:
    """The figures once the worker is idle: a call's answer is sent when its result is set,
    a moment before the worker clears its busy flag, so a scrape right after can see it busy."""
    deadline = time.monotonic() + 10
    while (now := samples(http)).get(("twinkle_worker_busy", (("worker", "model"),))) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.01)
    return now


def test_every_answer_carries_a_request_id_and_errors_name_it(tenants):
    _, alice, _ = tenants
    ok = alice.get("/capacity")
    assert re.fullmatch(r"req-[0-9a-f]{16}", ok.headers["x-request-id"])
    refused = alice.post("/twinkle/model/forward_backward", {"training_run_id": "nope:train:0"})
    assert refused.status_code == 404
    assert refused.json()["request_id"] == refused.headers["x-request-id"]
    mine = alice.http.get("/api/v1/capacity", headers={**alice.headers, "X-Request-Id": "trace-7"})
    assert mine.headers["x-request-id"] == "trace-7"
    odd = alice.http.get("/api/v1/capacity", headers={**alice.headers, "X-Request-Id": "a b\x01"})
    assert odd.headers["x-request-id"].startswith("req-")
    assert alice.http.get("/api/v1/capacity").json()["request_id"].startswith("req-")  # 401


def test_metrics_count_routes_tokens_per_key_and_slots(tenants):
    state, alice, bob = tenants
    before = samples(alice.http)
    run = alice.new_run()
    for _ in range(3):
        alice.ok(run, "forward_backward", inputs=[FEATURE, FEATURE])
    after = settled(alice.http)
    alice_id, bob_id = alice.key_id(), bob.key_id()

    def grew(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("twinkle_tokens_trained_total", tenant=alice_id) == 3 * 2 * TARGET_TOKENS
    assert grew("twinkle_tokens_trained_total", tenant=bob_id) == 0
    route = "/api/v1/twinkle/model/{method}"
    assert grew("twinkle_http_requests_total", method="POST", route=route, status="200") == 3
    assert grew("twinkle_http_request_duration_seconds_count", method="POST", route=route) == 3
    used = after[("twinkle_lora_slots", (("state", "used"),))]
    free = after[("twinkle_lora_slots", (("state", "free"),))]
    assert used == len(state.model.live) >= 1 and used + free == state.config.model.max_loras
    assert after[("twinkle_lora_slots_held", (("tenant", alice_id),))] == state.model.slots_held(
        alice_id
    )
    assert after[("twinkle_queue_depth", (("worker", "model"),))] == 0
    one = (("replica", "0"),)  # one copy of the model: its figures are the totals
    per_copy = {k: v for k, v in after.items() if k[0].startswith("twinkle_replica")}
    assert per_copy == {
        ("twinkle_replica_lora_slots", (*one, ("state", "used"))): used,
        ("twinkle_replica_lora_slots", (*one, ("state", "free"))): free,
        ("twinkle_replica_queue_depth", one): 0,
        ("twinkle_replica_busy", one): 0,
    }
    unmatched = (
        "twinkle_http_requests_total",
        (("method", "GET"), ("route", "unmatched"), ("status", "404")),
    )
    alice.http.get("/no/such/path")
    assert samples(alice.http).get(unmatched, 0) == after.get(unmatched, 0) + 1

    usage = {u.metric: u.amount for u in state.store.usage(alice_id)}
    assert usage["train_tokens"] >= 3 * 2 * TARGET_TOKENS
    assert "train_tokens" not in {u.metric for u in state.store.usage(bob_id)}


def test_dashboard_data_is_the_callers_own(tenants):
    state, alice, bob = tenants
    run = alice.new_run()
    for _ in range(2):
        alice.ok(run, "forward_backward", inputs=[FEATURE])
    data = alice.get("/dashboard").json()
    mine = next(r for r in data["runs"] if r["id"] == run)
    assert len(mine["losses"]) == 2 and all(loss > 0 for _, loss in mine["losses"])
    assert data["slots"] == alice.get("/capacity").json()
    assert set(data["queues"]) == {"model"} and data["key"]["name"] == "alice"
    theirs = bob.get("/dashboard").json()
    assert run not in {r["id"] for r in theirs["runs"]}
    page = alice.http.get("/dashboard")
    assert page.status_code == 200 and 'id="run-rows"' in page.text
    assert (
        alice.http.get("/dashboard/dashboard.js")
        .headers["content-type"]
        .startswith("text/javascript")
    )
    assert alice.http.get("/dashboard/secret.py").status_code == 404


def test_tinker_telemetry_is_stored_under_the_callers_key(tenants):
    from datetime import UTC, datetime

    from tinker.types.generic_event import GenericEvent
    from tinker.types.session_start_event import SessionStartEvent
    from tinker.types.telemetry_send_request import TelemetrySendRequest

    state, alice, bob = tenants
    now = datetime.now(UTC)
    sent = TelemetrySendRequest(  # what the SDK's telemetry flush posts, serialised as it does
        events=[
            SessionStartEvent(
                event="SESSION_START",
                event_id="e1",
                event_session_index=0,
                severity="INFO",
                timestamp=now,
            ),
            GenericEvent(
                event="GENERIC_EVENT",
                event_id="e2",
                event_name="queue",
                event_session_index=1,
                severity="WARNING",
                timestamp=now,
                event_data={"depth": 3},
            ),
        ],
        platform="Linux",
        sdk_version="0.38.0",
        session_id=alice.session,
        process_uuid="p",
    )
    body = sent.model_dump(mode="json", exclude_none=True)
    assert alice.post("/telemetry", body).json() == {"status": "accepted"}
    kept = state.store.list_telemetry(alice.key_id(), 10)
    assert [t.event["event"] for t in kept[:2]] == ["GENERIC_EVENT", "SESSION_START"]
    assert kept[0].session_id == alice.session and kept[0].sdk_version == "0.38.0"
    assert kept[0].event["event_data"] == {"depth": 3} and kept[0].platform == "Linux"
    assert state.store.list_telemetry(bob.key_id(), 10) == []
    assert alice.get("/dashboard").json()["telemetry"][0]["event"]["event"] == "GENERIC_EVENT"
    assert alice.post("/telemetry", {"events": "x"}).status_code == 400
    assert alice.post("/telemetry", {"events": [{}] * 1001}).status_code == 413


def test_tokens_and_losses_are_read_from_both_protocols_results():
    import numpy as np

    from twinkle.server.observability.work_results import sampled_tokens, trained_tokens
    from twinkle.server.tinker.codec import encode_forward_backward_output
    from twinkle.server.tinker.sample_codec import TinkerSequence, encode_sample_response

    outputs = [{"logprobs": np.zeros(5, np.float32)}, {"logprobs": np.zeros(3, np.float32)}]
    tinker_step = encode_forward_backward_output(outputs, {"loss:sum": 16.0})
    assert trained_tokens(tinker_step) == (8, 2.0)
    assert trained_tokens({"num_tokens": 6.0, "loss": 1.5, "logps": [[0.0]]}) == (6, 1.5)
    sequences = [TinkerSequence([1, 2, 3], [0.0] * 3, "stop"), TinkerSequence([4], [0.0], "length")]
    assert sampled_tokens(encode_sample_response(sequences)) == 4
    assert sampled_tokens({"sequences": [{"tokens": [1, 2]}], "responses": []}) == 2
    assert trained_tokens(None) == (0, None) and sampled_tokens("x") == 0


def test_metrics_are_open_by_default_and_need_the_token_when_configured(
    tenants, tmp_path, monkeypatch
):
    """Open is the explicit default (a Prometheus scrape sends no credentials); with
    ``metrics.auth: token`` a request without the token is a 401, a wrong one (an API key
    included) a 403, the token a 200; a missing or short token stops the start."""
    from fastapi.testclient import TestClient

    from twinkle.server.app import create_app
    from twinkle.server.config import MetricsConfig, ServerConfig
    from twinkle.server.state import build_state

    state, alice, _ = tenants
    assert state.config.metrics.auth == "open"
    assert alice.http.get("/metrics").status_code == 200
    token = "metrics-" + "7f" * 16
    monkeypatch.setenv("TWINKLE_METRICS_TOKEN", token)
    config = ServerConfig.model_validate(
        {"storage": {"home": str(tmp_path)}, "metrics": {"auth": "token"}}
    )
    guarded = build_state(config, load_components=False)
    try:
        with TestClient(create_app(guarded), raise_server_exceptions=False) as http:
            missing = http.get("/metrics")
            assert missing.status_code == 401, missing.text
            assert "Authorization: Bearer" in missing.json()["error"]
            for header in (
                {"Authorization": "Bearer wrong-token-of-some-length"},
                {"Authorization": f"Basic {token}"},
                {"Authorization": f"Bearer {alice.key}"},
            ):
                assert http.get("/metrics", headers=header).status_code == 403, header
            assert http.get("/metrics", headers={"X-API-Key": alice.key}).status_code == 401
            good = http.get("/metrics", headers={"Authorization": f"Bearer {token}"})
            assert good.status_code == 200 and "twinkle_http_requests_total" in good.text
        for value in ("", "short"):
            monkeypatch.setenv("TWINKLE_METRICS_TOKEN", value)
            with pytest.raises(ValueError, match="TWINKLE_METRICS_TOKEN"):
                create_app(guarded)
        with pytest.raises(ValueError, match="auth"):
            MetricsConfig.model_validate({"auth": "password"})
    finally:
        guarded.close()


def test_loss_curves_are_read_from_the_store_after_a_restart(tmp_path):
    """The meter keeps each run's finite losses in the state file: a new server process
    (a new state on the same file) shows the same curve."""
    from twinkle.server.config import ServerConfig
    from twinkle.server.observability import Meter
    from twinkle.server.state import build_state

    config = ServerConfig.model_validate({"storage": {"home": str(tmp_path)}})
    first = build_state(config, load_components=False)
    meter = Meter(first)
    for loss in (2.0, 1.5, float("nan"), 1.25):
        meter.on_finished("key-a", "forward_backward", "run-1", {"loss": loss, "num_tokens": 4})
    curve = meter.losses("key-a", "run-1")
    first.close()
    assert [loss for _, loss in curve] == [2.0, 1.5, 1.25]  # a NaN step has no point
    second = build_state(config, load_components=False)
    try:
        assert Meter(second).losses("key-a", "run-1") == curve
        assert Meter(second).losses("key-b", "run-1") == []
    finally:
        second.close()
