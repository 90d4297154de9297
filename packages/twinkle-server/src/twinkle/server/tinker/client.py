"""The SDK's start-up and housekeeping routes: client/config, dynamic_config, telemetry
(stored), and the session listing of the RestClient.

client/config turns off the SDK features this server does not offer (JWT exchange, the
session-level futures poller, joined sampling sessions, server-side custom losses, zstd
bodies), so the client never calls their endpoints, and tells it the largest chunk of datums
to send (limits.max_batch_rows).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from twinkle.server.errors import BadRequest, NotFound, PayloadTooLarge
from twinkle.server.routes.common import caller, json_body, state_of
from twinkle.server.routes.runs import page
from twinkle.server.store import TelemetryEvent

router = APIRouter()
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "sample_use_retrieve_futures": False,
    "sample_join_sampling_session": False,
    "custom_loss_server_side": False,
    "proto_compress_fwdbwd": False,
    "parallel_fwdbwd_chunks": True,
}
MAX_RUNS_LISTED = 1000
MAX_TELEMETRY_EVENTS = 1000  # the SDK flushes far fewer at a time


@router.post("/client/config")
async def client_config(request: Request) -> dict:
    """The feature flags, and the SDK's forward_backward chunk size set to this server's row
    limit: the SDK splits a large batch into chunks no larger than the server takes."""
    caller(request)
    limits = state_of(request).config.limits
    return {**CLIENT_CONFIG, "fwdbwd_max_chunk_len": limits.max_batch_rows}


@router.post("/client/dynamic_config")
async def dynamic_config(request: Request) -> dict:
    caller(request)
    return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}


@router.post("/telemetry")
async def telemetry(request: Request) -> dict:
    """The SDK's events (session starts and ends, exceptions it met, timings), kept in the
    store under the caller's key as they came: an operator reads a tenant's client errors
    beside the server's log (``/api/v1/dashboard`` shows the latest)."""
    principal = caller(request)
    body = await json_body(request)
    events = body.get("events")
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise BadRequest("telemetry needs 'events': a list of objects")
    if len(events) > MAX_TELEMETRY_EVENTS:
        raise PayloadTooLarge(
            f"{len(events)} telemetry events in one batch; at most {MAX_TELEMETRY_EVENTS}"
        )
    meta = {name: body.get(name) for name in ("session_id", "platform", "sdk_version")}
    meta = {name: v if isinstance(v, str) else None for name, v in meta.items()}
    now = time.time()
    state_of(request).store.add_telemetry(
        [TelemetryEvent(principal.key_id, received_at=now, event=e, **meta) for e in events]
    )
    return {"status": "accepted"}


@router.get("/sessions")
async def list_sessions(request: Request) -> dict:
    principal = caller(request)
    limit, offset = page(request)
    sessions = state_of(request).store.list_sessions(principal.key_id, limit, offset)
    return {"sessions": [session.id for session in sessions]}


@router.get("/sessions/{session_id}")
async def get_session(session_id: str, request: Request) -> dict:
    principal = caller(request)
    state = state_of(request)
    session = state.store.get_session(principal.key_id, session_id)
    if session is None:
        raise NotFound(f"no session {session_id!r}")
    runs, _ = state.store.list_runs(principal.key_id, MAX_RUNS_LISTED, 0)
    samplers = state.tinker.sampling.session_sampler_ids(principal, session_id)
    return {
        "training_run_ids": [run.id for run in runs if run.session_id == session_id],
        "sampler_ids": samplers,
        "user_metadata": session.metadata,
    }
