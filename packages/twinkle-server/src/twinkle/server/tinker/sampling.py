"""Tinker's sampling routes: create_sampling_session, GET /samplers/{id} and asample.

``asample`` answers at once with the request id and one ``sample_sequence_ids`` entry per
sample (SDK 0.38 asserts them); the sampling runs on the sampler service's worker, in the
caller's lane, and its result (protobuf for SDK 0.38, JSON for 0.16.1) is fetched with
``retrieve_future``. A retry with the same ``X-Idempotency-Key`` gets the first request's
future and the same sequence ids.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from twinkle.server.errors import BadRequest
from twinkle.server.routes.common import caller, field, idempotency_key, json_body, ready, state_of
from twinkle.server.state import ServerState
from twinkle.server.tinker.base_model import check_base_model
from twinkle.server.tinker.sample_request import Limits, parse_asample, tinker_result
from twinkle.server.tinker.sampling_sessions import SamplingSessions

__all__ = ["SamplingSessions", "sampling_router"]

sampling_router = APIRouter()


def _sampler(state: ServerState) -> Any:
    """The sampler service. Its absence is the server's configuration, not a passing state:
    a 4xx, since the SDK retries a 503 for minutes."""
    if state.sampler is None or not state.sampler.available or state.tinker.sampling is None:
        raise BadRequest(
            "this server does not sample: its operator has not enabled a sampler "
            "(sampler.enabled in the server config)"
        )
    return state.sampler


def _check_base_model(state: ServerState, base_model: str | None) -> None:
    check_base_model(state.model.base_model, base_model, "samples")


def _checkpoint_folder(state: ServerState, principal: Any, model_path: str) -> str:
    """The folder of a checkpoint the caller owns, named by its tinker:// (or twinkle://) path."""
    return state.model.owned_checkpoint(principal, model_path).path


@sampling_router.post("/create_sampling_session")
async def create_sampling_session(request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    _sampler(state)
    body = await json_body(request)
    session = state.sessions.get_open(principal, field(body, "session_id", str))
    seq = field(body, "sampling_session_seq_id", int)
    model_path = field(body, "model_path", str, None)
    base_model = field(body, "base_model", str, None)
    if model_path is None and base_model is None:
        raise BadRequest("pass model_path (a tinker:// checkpoint) or base_model")
    _check_base_model(state, base_model)
    folder = _checkpoint_folder(state, principal, model_path) if model_path else None
    sampler_id = state.tinker.sampling.register(principal, session.id, seq, folder, model_path)
    return {"type": "create_sampling_session", "sampling_session_id": sampler_id}


@sampling_router.get("/samplers/{sampler_id}")
async def get_sampler(sampler_id: str, request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    _sampler(state)
    entry = state.tinker.sampling.get(principal, sampler_id)
    return {
        "sampler_id": entry.sampler_id,
        "base_model": state.model.base_model,
        "model_path": entry.model_path,
    }


def _folder_to_sample(state: ServerState, principal: Any, body: dict[str, Any]) -> str | None:
    """The adapter folder an asample names (None: the base model): a sampler id, else a
    checkpoint path, else the base model."""
    sampler_id = field(body, "sampling_session_id", str, None)
    if sampler_id is not None:
        return state.tinker.sampling.get(principal, sampler_id).checkpoint_folder
    model_path = field(body, "model_path", str, None)
    if model_path is not None:
        return _checkpoint_folder(state, principal, model_path)
    base_model = field(body, "base_model", str, None)
    if base_model is None:
        raise BadRequest("asample needs sampling_session_id (or model_path or base_model)")
    _check_base_model(state, base_model)
    return None


def _limits(state: ServerState, service: Any) -> Limits:
    return Limits(
        max_tokens=state.config.sampler.max_tokens,
        request=state.config.limits,
        vocab_size=service.vocab_size(),
    )


@sampling_router.post("/asample")
async def asample(request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    service = _sampler(state)
    body = await json_body(request)
    folder = _folder_to_sample(state, principal, body)
    sample = parse_asample(body, _limits(state, service))
    params = sample.params
    if params.seed is None:  # from the key's own generator, as on the Twinkle route
        params = params.model_copy(update={"seed": service.next_seed(principal.key_id)})
    work = service.sample_tokens(sample.prompt, params, folder)
    future_id = state.futures.submit(
        principal.key_id,
        "sample",
        service.worker,
        principal.key_id,
        lambda: tinker_result(work(), sample),
        idempotency_key(request),
        None,
    )
    count = sample.params.num_samples
    return {
        "request_id": future_id,
        "sample_sequence_ids": [f"{future_id}:{i}" for i in range(count)],
    }
