"""What every route needs: the state, the caller, a JSON body, and waiting on work."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from twinkle.server.auth import Principal
from twinkle.server.errors import BadRequest, Unavailable
from twinkle.server.state import ServerState
from twinkle.server.wire import parse_json


def state_of(request: Request) -> ServerState:
    return request.app.state.twinkle


def caller(request: Request) -> Principal:
    """Authenticate the request (every route but healthz does)."""
    key = request.headers.get("x-api-key")
    if key is None:
        auth = request.headers.get("authorization", "")
        key = auth[7:] if auth.lower().startswith("bearer ") else None
    return state_of(request).principal(key)


def ready(state: ServerState) -> ServerState:
    if not state.ready:
        raise Unavailable("the server is still loading its model; retry shortly")
    return state


async def json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    body = parse_json(raw, state_of(request).config.limits)
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def field(body: dict[str, Any], name: str, kind: type | tuple, default: Any = ...) -> Any:
    """``body[name]`` checked to be of ``kind``; missing is an error unless a default is given."""
    if name not in body or body[name] is None:
        if default is ...:
            raise BadRequest(f"the request needs {name!r}")
        return default
    value = body[name]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise BadRequest(f"{name!r} has the wrong type: got a bool")
    if not isinstance(value, kind):
        raise BadRequest(f"{name!r} has the wrong type: got {type(value).__name__}")
    return value


def idempotency_key(request: Request) -> str | None:
    key = request.headers.get("x-idempotency-key")
    if key is not None and len(key) > 200:
        raise BadRequest("X-Idempotency-Key is longer than 200 characters")
    return key
