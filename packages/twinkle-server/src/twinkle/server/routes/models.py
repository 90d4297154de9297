"""The Twinkle model and sampler routes: a client's proxy calls land here.

``POST /twinkle/model/add_adapter_to_model`` takes a LoRA slot and starts a training run;
``POST /twinkle/model/{method}`` runs one allow-listed method for a run the caller owns,
on the model's worker in the run's lane, and answers with its result within the request
timeout. ``POST /twinkle/sampler/sample`` samples from the base model or a checkpoint the
caller owns.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from twinkle.server.errors import BadRequest, Unavailable
from twinkle.server.names import check_name
from twinkle.server.routes.common import (
    caller,
    field,
    idempotency_key,
    json_body,
    ready,
    state_of,
)

router = APIRouter()


async def _run_work(
    request: Request, principal, operation: str, worker, lane: str, fn, batch=None
) -> Any:
    """Queue ``fn`` and answer with its result; ``compute_ms`` is the time it ran on the
    worker (absent for a retry answered from the first request's work), so a client can
    tell the service's overhead and queueing from the work itself. With ``batch`` (a
    ``scheduler.Batchable``) the work may share a pass with other runs': ``compute_ms`` is
    then the pass's time and ``pass_size`` how many requests it ran."""
    state = state_of(request)
    timeout = state.config.limits.request_timeout_s
    timing: dict[str, float] = {} if batch is None else batch.timing

    def timed() -> Any:
        start = time.perf_counter()
        try:
            return fn()
        finally:
            timing["compute_ms"] = (time.perf_counter() - start) * 1e3

    future_id = state.futures.submit(
        principal.key_id, operation, worker, lane, timed, idempotency_key(request), timeout, batch
    )
    result = await state.futures.wait(principal.key_id, future_id, timeout)
    return {"result": result, "request_id": future_id, **timing}


@router.post("/twinkle/model/add_adapter_to_model")
async def add_adapter(request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    body = await json_body(request)
    model_id = field(body, "model_id", str, None)
    if model_id is not None and model_id != state.model.base_model:
        raise BadRequest(
            f"this server trains {state.model.base_model!r}, not {model_id!r}; pass that "
            "model_id (or none)"
        )
    session = state.sessions.get_open(principal, field(body, "session_id", str))
    name = check_name(field(body, "adapter_name", str, "default"), "adapter name")
    lora = state.model.lora_config(field(body, "config", dict, {}))
    steps = field(body, "gradient_accumulation_steps", int, 1)
    if steps < 1:
        raise BadRequest("gradient_accumulation_steps must be >= 1")
    metadata = field(body, "user_metadata", dict, {})
    run_id = f"{session.id}:train:{state.store.next_model_seq(session.id)}"
    while state.store.get_run(principal.key_id, run_id) is not None:  # a Tinker create_model
        run_id = f"{session.id}:train:{state.store.next_model_seq(session.id)}"  # chose its seq

    def create() -> dict:
        run = state.model.create_run(principal, session.id, run_id, name, lora, steps, metadata)
        return {"training_run_id": run.id, "base_model": run.base_model}

    return await _run_work(
        request, principal, "add_adapter_to_model", state.model.worker, run_id, create
    )


@router.post("/twinkle/model/remove_adapter")
async def remove_adapter(request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    body = await json_body(request)
    live = state.model.live_run(principal, field(body, "training_run_id", str))
    return await _run_work(
        request,
        principal,
        "remove_adapter",
        state.model.worker,
        live.run.id,
        lambda: state.model.release(live.run.id),
    )


@router.post("/twinkle/model/{method}")
async def model_method(method: str, request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    body = await json_body(request)
    live = state.model.live_run(principal, field(body, "training_run_id", str))
    if method not in state.model.methods:
        raise BadRequest(
            f"unknown model method {method!r}; known: {', '.join(sorted(state.model.methods))}"
        )
    args = field(body, "args", dict, {})
    return await _run_work(
        request,
        principal,
        method,
        state.model.worker,
        live.run.id,
        lambda: state.model.call(principal, live, method, args),
        state.model.batchable(principal, live, method, args),
    )


@router.post("/twinkle/sampler/sample")
async def sample(request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    if state.sampler is None or not state.sampler.available:
        raise Unavailable("this server has no sampler enabled")
    body = await json_body(request)
    job = state.sampler.prepare(principal, body)
    return await _run_work(
        request,
        principal,
        "sample",
        state.sampler.worker,
        principal.key_id,
        job,
        state.sampler.batchable(job),
    )


@router.post("/twinkle/sampler/set_template")
async def sampler_template(request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    if state.sampler is None or not state.sampler.available:
        raise Unavailable("this server has no sampler enabled")
    state.sampler.set_template(principal, await json_body(request))
    return {"result": None}
