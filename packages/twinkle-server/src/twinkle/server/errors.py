"""The errors the service answers with: an HTTP status, a category and a message, as JSON.

``category`` is ``"user"`` when the request was wrong (fix it and retry) and ``"server"``
when the service failed; lowercase, as the Tinker SDK expects. No traceback ever leaves
the server: unexpected exceptions are logged and answered with a generic message.

``as_api_error`` is the one place an exception becomes an answer, for every route family
and for failed futures alike: an ``ApiError`` is itself; a ``ValueError`` or ``TypeError``
(the library's way of refusing a caller's values, raised in this process or on a Ray
worker) is a 400 with its message; anything else is a genuine server fault, a 500.
"""

from __future__ import annotations


class ApiError(Exception):
    """An error with the HTTP status and the JSON body the client receives."""

    status = 400
    category = "user"
    code = "bad_request"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self) -> dict[str, str]:
        return {"error": self.message, "category": self.category, "code": self.code}


class BadRequest(ApiError):
    status, code = 400, "bad_request"


class Unauthorized(ApiError):
    status, code = 401, "unauthorized"


class Forbidden(ApiError):
    status, code = 403, "forbidden"


class NotFound(ApiError):
    status, code = 404, "not_found"


class Conflict(ApiError):
    status, code = 409, "conflict"


class PayloadTooLarge(ApiError):
    status, code = 413, "payload_too_large"


class Unprocessable(ApiError):
    status, code = 422, "invalid_request"


class RateLimited(ApiError):
    status, code = 429, "rate_limited"


class Timeout(ApiError):
    status, category, code = 408, "user", "timeout"


class CapacityFull(ApiError):
    status, category, code = 503, "server", "capacity"


class Unavailable(ApiError):
    status, category, code = 503, "server", "unavailable"


class ServerFailure(ApiError):
    status, category, code = 500, "server", "internal"


USER_MISTAKES = (ValueError, TypeError)
"""What the library raises for a caller's values (wrong shape, range, name or keyword)."""


def as_api_error(exc: BaseException) -> ApiError:
    """The answer for ``exc`` (see the module docstring). A worker's failure arrives as a
    RemoteError whose ``__cause__`` is the worker's exception; its own message carries the
    worker's traceback and stays in the server's log."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    from twinkle.infra import RemoteError

    if isinstance(exc, RemoteError) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        )
        return Unprocessable(problems)
    if isinstance(exc, HTTPException):
        answer = ApiError(str(exc.detail))
        answer.status, answer.code = exc.status_code, "http"
        answer.category = "user" if exc.status_code < 500 else "server"
        return answer
    if isinstance(exc, USER_MISTAKES):
        return BadRequest(str(exc))
    return ServerFailure("internal server error")
