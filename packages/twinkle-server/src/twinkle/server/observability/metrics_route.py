"""``GET /metrics``: the Prometheus text format. Open by default, as a scrape without
credentials expects (keep the port private to the cluster); with ``metrics.auth: token`` it
answers only a request bearing the operator's metrics token. Tenants appear as their key
ids, never their keys or names."""

from __future__ import annotations

import hmac
import os

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from twinkle.server.config import MetricsConfig
from twinkle.server.errors import Forbidden, Unauthorized

router = APIRouter()
MIN_TOKEN_CHARS = 16


def metrics_token(config: MetricsConfig) -> str | None:
    """The token ``/metrics`` requires (None: open); a missing or short one stops the start."""
    if config.auth == "open":
        return None
    token = os.environ.get(config.token_env, "").strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"metrics.auth is 'token' but the environment variable {config.token_env} is "
            f"{'unset' if not token else 'shorter than 16 characters'}: set it to a random "
            "secret (e.g. `openssl rand -hex 32`) and give Prometheus the same "
            "(authorization: credentials_file), or set metrics.auth: open"
        )
    return token


def check_bearer(request: Request, token: str) -> None:
    """401 without credentials, 403 with the wrong ones."""
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if not header:
        raise Unauthorized(
            "GET /metrics needs the metrics token (metrics.auth is 'token'): send "
            "Authorization: Bearer <token>"
        )
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        presented.strip().encode(), token.encode()
    ):
        raise Forbidden("that is not the metrics token (an API key does not read /metrics)")


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    token = request.app.state.metrics_token
    if token is not None:
        check_bearer(request, token)
    registry = request.app.state.meter.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
