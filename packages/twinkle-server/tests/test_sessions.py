"""Sessions whose client stops heartbeating release their LoRA slots after a short grace.

A session that declares its heartbeat period (the Tinker SDK's create_session always does,
by its ``sdk_version``) is released ``session_heartbeat_grace_s`` after a missed beat, not
after the TTL; a refused slot says when one will free. Real time, short periods: the reaper
is called by hand so no test waits for its 5 s tick.
"""

from __future__ import annotations

import time

import pytest

from twinkle.server.sessions import REAP_INTERVAL_S, TINKER_SDK_HEARTBEAT_S

PERIOD_S = 1.0
GRACE_S = 1.0  # both well over the time a request takes here, so the app's own reaper
# (it runs every REAP_INTERVAL_S) never releases a session a test still beats for


@pytest.fixture
def short_grace(server):
    state, _, _ = server
    state.sessions.grace_s = GRACE_S
    yield state
    state.sessions.grace_s = state.config.limits.session_heartbeat_grace_s


def _session(http, key: str, body: dict) -> str:
    reply = http.post("/api/v1/create_session", json=body, headers={"X-API-Key": key})
    assert reply.status_code == 200, reply.text
    return reply.json()["session_id"]


def _run(http, key: str, session: str) -> str:
    body = {"session_id": session, "config": {"r": 2}}
    reply = http.post(
        "/api/v1/twinkle/model/add_adapter_to_model", json=body, headers={"X-API-Key": key}
    )
    assert reply.status_code == 200, reply.text
    return reply.json()["result"]["training_run_id"]


def _beat(http, key: str, session: str) -> int:
    body = {"session_id": session}
    return http.post("/api/v1/session_heartbeat", json=body, headers={"X-API-Key": key}).status_code


def _released(state, run: str, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if run not in state.model.live:
            return True
        time.sleep(0.05)
    return False


def test_the_tinker_sdk_and_a_declaring_client_get_their_period(server):
    state, http, keys = server
    tinker = _session(http, keys["alice"], {"sdk_version": "0.38.0", "type": "create_session"})
    declared = _session(http, keys["alice"], {"heartbeat_interval_s": 4})
    silent = _session(http, keys["alice"], {})
    grace, ttl = state.sessions.grace_s, state.sessions.ttl_s
    assert state.sessions.allowed_silence(tinker) == TINKER_SDK_HEARTBEAT_S + grace
    assert state.sessions.allowed_silence(declared) == 4 + grace
    assert state.sessions.allowed_silence(silent) == ttl
    for bad in (0, -1, "10", True):
        body = {"heartbeat_interval_s": bad}
        reply = http.post("/api/v1/create_session", json=body, headers={"X-API-Key": keys["bob"]})
        assert reply.status_code == 400 and "heartbeat_interval_s" in reply.json()["error"]


def test_a_session_that_stops_beating_is_released_after_the_grace_not_the_ttl(server, short_grace):
    state, http, keys = server
    key = keys["alice"]
    beating = _session(http, key, {"heartbeat_interval_s": PERIOD_S})
    undeclared = _session(http, key, {})
    run, kept = _run(http, key, beating), _run(http, key, undeclared)
    for _ in range(5):  # beating on time keeps it, well past period + grace
        time.sleep(PERIOD_S / 2)
        assert _beat(http, key, beating) == 200
        state.reap_sessions()
    assert run in state.model.live
    time.sleep(PERIOD_S + GRACE_S + 0.2)  # the client is gone: no more beats
    state.reap_sessions()
    assert _released(state, run), "a silent session kept its slot past its grace"
    assert _beat(http, key, beating) == 410
    assert kept in state.model.live  # no declared period: only the TTL (120 s) ends it
    assert state.sessions.ttl_s > 60
    http.post(f"/api/v1/sessions/{undeclared}/finish", json={}, headers={"X-API-Key": key})
    assert _released(state, kept)


def test_a_refused_slot_says_when_one_frees(server, short_grace, monkeypatch):
    state, http, keys = server
    monkeypatch.setattr(state.config.limits, "max_loras_per_key", state.config.model.max_loras)
    key = keys["bob"]
    session = _session(http, key, {"heartbeat_interval_s": PERIOD_S})
    runs = []
    while state.model.free_slots() > 0:
        runs.append(_run(http, key, session))
        assert _beat(http, key, session) == 200
    body = {"session_id": session, "config": {"r": 2}}
    add = "/api/v1/twinkle/model/add_adapter_to_model"

    assert _beat(http, key, session) == 200
    alive = http.post(add, json=body, headers={"X-API-Key": key})
    assert alive.status_code == 503, alive.text
    message = alive.json()["error"]
    assert "LoRA slots are in use" in message and "alive" in message, message
    assert "sess-" not in message  # the holders may be other tenants' sessions

    time.sleep(PERIOD_S + 0.05)  # a beat missed: the holder's client has stopped
    other = _session(http, keys["alice"], {})
    stopped = http.post(
        add, json={"session_id": other, "config": {"r": 2}}, headers={"X-API-Key": keys["alice"]}
    )
    assert stopped.status_code == 503, stopped.text
    message = stopped.json()["error"]
    assert "stopped heartbeating frees one within" in message, message
    within_s = int(message.split("within ")[1].split(" s")[0])
    assert REAP_INTERVAL_S <= within_s <= PERIOD_S + GRACE_S + REAP_INTERVAL_S + 1, message

    time.sleep(GRACE_S + 0.1)
    state.reap_sessions()
    assert all(_released(state, run) for run in runs)
    _run(http, keys["alice"], other)  # the freed slot is there for the next caller
