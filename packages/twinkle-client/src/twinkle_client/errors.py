"""Typed errors: one class per kind of failure the server reports.

Every error carries the server's ``category`` (``"user"``: fix the request; ``"server"``:
the service failed), its ``code`` and the HTTP ``status``.
"""

from __future__ import annotations


class TwinkleClientError(Exception):
    """Base class of every error this client raises."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        category: str = "unknown",
        code: str = "unknown",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.category = category
        self.code = code


class ConnectionFailed(TwinkleClientError):
    """The server could not be reached (after the retries)."""


class BadRequestError(TwinkleClientError):
    """400/422: the request was malformed or named something the server does not allow."""


class AuthenticationError(TwinkleClientError):
    """401: the API key is missing, unknown or revoked."""


class PermissionDeniedError(TwinkleClientError):
    """403: the key may not do this."""


class NotFoundError(TwinkleClientError):
    """404: no such resource for this key (another key's resources look the same)."""


class ConflictError(TwinkleClientError):
    """409: the resource is in the wrong state (e.g. its LoRA slot was released)."""


class RequestTimeoutError(TwinkleClientError):
    """408: the server did not finish in time; retrying with the same idempotency key
    receives the result if the work completed."""


class PayloadTooLargeError(TwinkleClientError):
    """413: the request exceeds a server limit."""


class RateLimitError(TwinkleClientError):
    """429: too many requests for this key."""


class SessionFinishedError(TwinkleClientError):
    """410: the session ended (closed, or expired without heartbeats)."""


class RequestLostError(TwinkleClientError):
    """410 with code ``lost``/``gone``: the server no longer holds this request's result
    (it restarted before the work finished, or dropped old results). Raised at once, never
    retried: send the request again (the work did not complete, or its answer is gone)."""


class ServerError(TwinkleClientError):
    """5xx: the server failed or is not ready (503 while it loads, or no LoRA slot free)."""


BY_STATUS: dict[int, type[TwinkleClientError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    408: RequestTimeoutError,
    409: ConflictError,
    410: SessionFinishedError,
    413: PayloadTooLargeError,
    422: BadRequestError,
    429: RateLimitError,
}


LOST_CODES = {"lost", "gone"}  # a request's result; other 410s are finished sessions


def from_response(status: int, body: object) -> TwinkleClientError:
    info = body if isinstance(body, dict) else {}
    message = str(info.get("error") or f"HTTP {status}")
    code = str(info.get("code", "unknown"))
    cls = BY_STATUS.get(status, ServerError if status >= 500 else TwinkleClientError)
    if status == 410 and code in LOST_CODES:
        cls = RequestLostError
    return cls(
        message,
        status=status,
        category=str(info.get("category", "unknown")),
        code=code,
    )
