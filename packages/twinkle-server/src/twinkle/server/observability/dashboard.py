"""The web dashboard: ``GET /dashboard`` serves a static page that asks for an API key and
then shows that key's runs, checkpoints, loss curves, usage, and the service's LoRA slot
pool and queues, from ``GET /api/v1/dashboard`` (the caller's own records only, like every
route; the pool and queue counts are the service's, as ``/api/v1/capacity`` shows them)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse

from twinkle.server.errors import NotFound
from twinkle.server.observability.meter import workers_of
from twinkle.server.routes.common import caller, ready, state_of
from twinkle.server.state import ServerState
from twinkle.server.store import CheckpointRecord

router = APIRouter()
STATIC = Path(__file__).parent / "static"
FILES = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
RUNS_SHOWN = 200
TELEMETRY_SHOWN = 20


@router.get("/dashboard")
async def page() -> FileResponse:
    return FileResponse(STATIC / "dashboard.html", media_type="text/html")


@router.get("/dashboard/{name}")
async def asset(name: str) -> FileResponse:
    if name not in FILES:
        raise NotFound(f"no dashboard file {name!r}")
    return FileResponse(STATIC / name, media_type=FILES[name])


@router.get("/api/v1/dashboard")
async def summary(request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    meter = request.app.state.meter
    runs, total = state.store.list_runs(principal.key_id, RUNS_SHOWN, 0)
    checkpoints = state.store.list_checkpoints(principal.key_id)
    return {
        "key": {"id": principal.key_id, "name": principal.name},
        "runs_total": total,
        "runs": [
            {
                "id": run.id,
                "base_model": run.base_model,
                "lora_rank": run.lora_rank,
                "created_at": run.created_at,
                "last_request_time": run.last_request_time,
                "active": run.active,
                "losses": meter.losses(principal.key_id, run.id),
            }
            for run in runs
        ],
        "checkpoints": [_checkpoint(c) for c in checkpoints],
        "slots": state.model.capacity(principal.key_id),
        "queues": _queues(state),
        "usage": [
            {"day": u.day, "metric": u.metric, "amount": u.amount}
            for u in state.store.usage(principal.key_id)
        ],
        "telemetry": [
            {"received_at": t.received_at, "session_id": t.session_id, "event": t.event}
            for t in state.store.list_telemetry(principal.key_id, TELEMETRY_SHOWN)
        ],
    }


def _checkpoint(record: CheckpointRecord) -> dict:
    return {
        "uri": f"twinkle://{record.run_id}/{record.kind}/{record.name}",
        "run_id": record.run_id,
        "kind": record.kind,
        "size_bytes": record.size_bytes,
        "created_at": record.created_at,
    }


def _queues(state: ServerState) -> dict:
    return {
        name: {"pending": worker.pending(), "busy": bool(worker.busy_lanes)}
        for name, worker in workers_of(state).items()
    }
