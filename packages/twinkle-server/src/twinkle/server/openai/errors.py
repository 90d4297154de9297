"""Error answers on the ``/v1`` routes in OpenAI's shape, ``{"error": {"message", "type",
"param", "code"}}``, which the OpenAI clients read into their exceptions' messages (a plain
string ``error`` leaves them with only ``Error code: 400``). The status is the same as on
every other route; ``category`` and ``request_id`` ride along."""

from __future__ import annotations

from typing import Any

PREFIX = "/v1/"
TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def openai_error_body(body: dict[str, Any], status: int) -> dict[str, Any]:
    """``body`` (``errors.ApiError.body()`` plus ``request_id``) as OpenAI writes errors."""
    kind = TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    error = {
        "message": body["error"],
        "type": kind,
        "param": None,
        "code": body["code"],
        "category": body["category"],
    }
    return {"error": error, "request_id": body.get("request_id")}
