"""The limits on what one request may ask for, and the checks that enforce them.

Every size a client controls is declared once, in ``config.Limits`` (and the sampler's
``max_tokens``), and checked here before any work, alike on the Twinkle and Tinker routes:
the body size (``BodyLimit``), the JSON nesting depth, rows, tokens per row, samples per
prompt and the values of one tensor. A refusal is a 413 naming the limit's key, so an
operator knows what to raise. Also here: the per-key rate limit.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from twinkle.server.errors import BadRequest, PayloadTooLarge, RateLimited

if TYPE_CHECKING:
    from twinkle.server.config import Limits


def _over(what: str, limit: int, key: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"{what}; this server takes at most {limit} (limits.{key})")


def check_rows(count: int, limits: Limits, what: str = "the batch") -> None:
    """Rows of one request (sequences, datums, prompts)."""
    if count > limits.max_batch_rows:
        raise _over(f"{what} has {count} rows", limits.max_batch_rows, "max_batch_rows")


def check_tokens(count: int, limits: Limits, what: str) -> None:
    """Tokens of one row."""
    if count > limits.max_sequence_tokens:
        raise _over(f"{what} has {count} tokens", limits.max_sequence_tokens, "max_sequence_tokens")


def check_num_samples(value: Any, limits: Limits, what: str = "num_samples") -> int:
    """Completions per prompt: an int in ``[1, max_num_samples]``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadRequest(f"{what} must be a positive int, got {value!r}")
    if value > limits.max_num_samples:
        raise _over(f"{what} is {value}", limits.max_num_samples, "max_num_samples")
    return value


def check_sequences(prompts: int, per_prompt: int, limits: Limits) -> None:
    """Completions one sample request generates in all: ``prompts × per_prompt`` at most
    ``max_sample_sequences`` (one request must not hold the sampler for everyone else)."""
    if prompts * per_prompt > limits.max_sample_sequences:
        raise _over(
            f"the request asks for {prompts * per_prompt} completions ({prompts} prompts × "
            f"{per_prompt} each)",
            limits.max_sample_sequences,
            "max_sample_sequences",
        )


def check_tensor_size(shape: Sequence[int], limits: Limits, what: str) -> None:
    """The values a tensor of ``shape`` holds, checked before anything of that size is
    allocated (a sparse tensor of shape ``[1, 10**13]`` would ask for 36 TiB)."""
    size = math.prod(int(n) for n in shape)
    if size > limits.max_tensor_elements:
        raise _over(
            f"{what}: shape {list(shape)} holds {size} values",
            limits.max_tensor_elements,
            "max_tensor_elements",
        )


def check_depth(value: Any, limits: Limits) -> None:
    """Parsed JSON nests at most ``max_json_depth`` containers deep (checked without
    recursion: the check itself must not run out of stack)."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        item, depth = stack.pop()
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, dict | list):
                if depth >= limits.max_json_depth:
                    raise depth_error(limits)
                stack.append((child, depth + 1))


def depth_error(limits: Limits) -> PayloadTooLarge:
    return _over("the JSON body nests too deeply", limits.max_json_depth, "max_json_depth")


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
