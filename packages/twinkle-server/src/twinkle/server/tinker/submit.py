"""Submitting Tinker work: a future id at once, the work in seq_id order on the model's lane.

Every Tinker training request answers ``{"request_id", "model_id"}`` right away; the client
then polls ``retrieve_future``. A request rejected before queueing (bad body, unknown model)
frees its seq_id so the requests after it do not wait for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request

from twinkle.server.checks import INT64_MAX, integer
from twinkle.server.errors import ApiError, BadRequest
from twinkle.server.routes.common import caller, idempotency_key, state_of
from twinkle.server.scheduler import Batchable


def seq_of(body: dict[str, Any]) -> int:
    return check_seq_id(body.get("seq_id"))


def check_seq_id(seq_id: Any) -> int:
    """A training request's seq_id: 1, 2, 3... (0 is the model's creation, and protobuf
    reads a missing seq_id as 0, so 0 would answer with the create_model future)."""
    if seq_id is None:
        raise BadRequest("the request needs its seq_id (1, 2, 3... per training client)")
    return integer(seq_id, "seq_id", 1, INT64_MAX)


async def checked(
    request: Request, model_id: Any, seq_id: int, prepare: Callable[[], Awaitable[Any]]
) -> Any:
    """``await prepare()``, freeing ``seq_id`` in the ordering when it raises a user error
    (only for the caller's own runs: another key must not move a tenant's sequence)."""
    try:
        return await prepare()
    except ApiError:
        state = state_of(request)
        if isinstance(model_id, str) and state.store.get_run(caller(request).key_id, model_id):
            state.tinker.ordering.skip(model_id, seq_id)
        raise


def submit_ordered(
    request: Request,
    principal: Any,
    live: Any,
    seq_id: int,
    operation: str,
    work: Callable[[], Any],
    batch: Batchable | None = None,
) -> dict[str, Any]:
    """Queue ``work`` for ``live``'s run behind every smaller seq_id; answer its future.
    ``batch``: the work as an item that may share a pass with other runs' (``FairWorker``)."""
    state = state_of(request)
    model_id = live.run.id
    ordering = state.tinker.ordering
    existing = ordering.known(model_id, seq_id)
    if existing is not None:  # a resubmit: the first request's work is the answer
        return {"request_id": existing, "model_id": model_id}
    future_id, placeholder = state.futures.reserve(
        principal.key_id, operation, idempotency_key(request), lane=model_id
    )
    if placeholder is None:
        return {"request_id": future_id, "model_id": model_id}
    model = state.model

    def release() -> None:
        run = lambda: model.run_for(live, work)  # noqa: E731
        state.futures.start(placeholder, model.worker, model_id, run, batch)

    ordering.submit(
        model_id, seq_id, future_id, release, lambda exc: state.futures.fail(placeholder, exc)
    )
    return {"request_id": future_id, "model_id": model_id}


def submit_unordered(
    request: Request, principal: Any, lane: str, operation: str, work: Callable[[], Any]
) -> dict[str, Any]:
    """Queue work that no seq_id orders (creating a model) on the model's ``lane``."""
    state = state_of(request)
    future_id, placeholder = state.futures.reserve(
        principal.key_id, operation, idempotency_key(request), lane=lane
    )
    if placeholder is not None:
        state.futures.start(placeholder, state.model.worker, lane, work)
    return {"request_id": future_id}
