"""Per-key rate limits and the request body size limit."""

from __future__ import annotations

import threading
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from twinkle.server.errors import PayloadTooLarge, RateLimited


class RateLimiter:
    """A token bucket per key: ``per_minute`` requests, bursting up to a minute's worth."""

    def __init__(self, per_minute: int) -> None:
        self.rate = per_minute / 60.0
        self.capacity = float(per_minute)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def check(self, key_id: str) -> None:
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key_id, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - last) * self.rate)
            if tokens < 1:
                self._buckets[key_id] = (tokens, now)
                raise RateLimited(
                    f"rate limit of {int(self.capacity)} requests a minute exceeded; retry later"
                )
            self._buckets[key_id] = (tokens - 1, now)


class BodyLimit:
    """ASGI middleware: refuse bodies over ``max_bytes`` (declared or streamed) with a 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await _reject(send, self.max_bytes)
                return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise PayloadTooLarge(f"the request body exceeds {self.max_bytes} bytes")
            return message

        await self.app(scope, limited, send)


async def _reject(send: Send, max_bytes: int) -> None:
    import json

    body = json.dumps(PayloadTooLarge(f"the request body exceeds {max_bytes} bytes").body())
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body.encode()})
