"""Each request gets an id (the caller's ``X-Request-Id`` when it sends a sane one), echoed
in the ``X-Request-Id`` answer header, written into every error body (``request_id``) and
into the one access-log line per request, so a user's report and the server's log meet.
The same middleware counts each request and its latency by route template for /metrics."""

from __future__ import annotations

import contextvars
import logging
import re
import secrets
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from twinkle.utils import get_logger

logger = get_logger("twinkle.server.access")
_REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


def current_request_id() -> str | None:
    """The id of the request this code runs for (None outside a request)."""
    return _REQUEST_ID.get()


def route_of(scope: Scope) -> str:
    """The route's template (``/api/v1/twinkle/model/{method}``), never the raw path, so
    the metrics' label values stay few; ``unmatched`` for paths no route took. An included
    router's route may know only its own part (``/twinkle/model/{method}``, as FastAPI 0.165
    keeps it): the prefix is what the request's path holds before that part."""
    route = scope.get("route")
    template = getattr(route, "path_format", None)
    if not template:
        return "unmatched"
    concrete = template
    for name, value in (scope.get("path_params") or {}).items():
        concrete = concrete.replace("{" + name + "}", str(value))
    path = scope.get("path", "")
    prefix = path[: -len(concrete)] if concrete and path.endswith(concrete) else ""
    return prefix + template


class RequestObserver:
    """ASGI middleware, outermost: the id, the access log and the per-route metrics."""

    def __init__(self, app: ASGIApp, meter: Any) -> None:
        self.app = app
        self.meter = meter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        asked = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = asked if SANE_ID.match(asked) else "req-" + secrets.token_hex(8)
        token = _REQUEST_ID.set(request_id)
        status = {"code": 500}
        start = time.perf_counter()

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                headers = list(message.get("headers") or [])
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, stamped)
        finally:
            elapsed = time.perf_counter() - start
            route = route_of(scope)
            self.meter.observe_request(scope["method"], route, status["code"], elapsed)
            # Refusals and faults at INFO; the steady traffic (Tinker polls) at DEBUG.
            level = logging.INFO if status["code"] >= 400 else logging.DEBUG
            logger.log(
                level,
                f"request_id={request_id} {scope['method']} {route} {status['code']} "
                f"{elapsed * 1e3:.1f}ms",
            )
            _REQUEST_ID.reset(token)
