"""Service-wide routes: health, capabilities, capacity, sessions, the remote API table."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from twinkle.server.routes.common import caller, field, json_body, ready, state_of
from twinkle.server.sessions import declared_heartbeat

router = APIRouter()


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    state = state_of(request)
    if not state.ready:
        return JSONResponse(status_code=503, content={"status": "loading"})
    return JSONResponse({"status": "ok"})


@router.get("/get_server_capabilities")
async def capabilities(request: Request) -> dict:
    caller(request)
    state = ready(state_of(request))
    config = state.config
    return {
        "supported_models": [
            {
                "model_name": config.model.model_id,
                "trainable": True,
                "sampleable": state.sampler is not None and state.sampler.available,
                "max_rank": config.model.max_rank,
            }
        ],
        "max_loras": state.model.max_loras,
        "losses": config.allow.losses,
        "optimizers": config.allow.optimizers,
        "lr_schedulers": config.allow.lr_schedulers,
        "templates": config.allow.templates,
        "processors": config.allow.processors,
        "preprocessors": config.allow.preprocessors,
        "datasets": config.allow.datasets,
    }


@router.get("/capacity")
async def capacity(request: Request) -> dict:
    """The LoRA pool as the caller sees it (``ModelService.capacity``): its own slots only."""
    principal = caller(request)
    return ready(state_of(request)).model.capacity(principal.key_id)


@router.get("/twinkle/api")
async def remote_api(request: Request) -> dict:
    from twinkle.server.remote_api import describe

    caller(request)
    return describe()


@router.post("/create_session")
async def create_session(request: Request) -> dict:
    principal = caller(request)
    body = await json_body(request)
    metadata = field(body, "user_metadata", dict, {})
    period = declared_heartbeat(body)
    session = state_of(request).sessions.create(principal, metadata, period)
    return {"session_id": session.id, "user_metadata": session.metadata}


@router.post("/session_heartbeat")
async def heartbeat(request: Request) -> dict:
    principal = caller(request)
    body = await json_body(request)
    state_of(request).sessions.heartbeat(principal, field(body, "session_id", str))
    return {}


@router.post("/sessions/{session_id}/finish")
async def finish_session(session_id: str, request: Request) -> dict:
    principal = caller(request)
    state = state_of(request)
    state.sessions.get_open(principal, session_id)
    state.sessions.close(session_id)
    state.release_session_runs(session_id)
    return {}


@router.get("/futures/{future_id}")
async def future_status(future_id: str, request: Request) -> dict:
    principal = caller(request)
    record = state_of(request).futures.status(principal.key_id, future_id)
    return {"request_id": record.id, "status": record.status, "error": record.error}
