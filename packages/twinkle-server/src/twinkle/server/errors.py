"""The errors the service answers with: an HTTP status, a category and a message, as JSON.

``category`` is ``"user"`` when the request was wrong (fix it and retry) and ``"server"``
when the service failed; lowercase, as the Tinker SDK expects. No traceback ever leaves
the server: unexpected exceptions are logged here and answered with a generic message.
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
