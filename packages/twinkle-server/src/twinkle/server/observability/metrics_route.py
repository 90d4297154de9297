"""``GET /metrics``: the Prometheus text format, unauthenticated as scrapers expect (keep the
port private to the cluster). Tenants appear as their key ids, never their keys or names."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter()


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry = request.app.state.meter.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
