"""What the service is doing, for its operator and its tenants: Prometheus ``/metrics``,
request ids in every answer and log line, per-key usage in the store, loss curves, and the
web dashboard at ``/dashboard``.

``install(app, state)`` wires it into an app: the request middleware (ids, per-route
counts and latency), an observer of finished work (tokens trained and sampled per key,
each run's losses), and the routes.
"""

from __future__ import annotations

from fastapi import FastAPI

from twinkle.server.observability.meter import Meter
from twinkle.server.observability.requests import RequestObserver, current_request_id
from twinkle.server.state import ServerState

__all__ = ["Meter", "current_request_id", "install"]


def install(app: FastAPI, state: ServerState) -> Meter:
    """The app's meter; call after the other middleware so request ids cover every answer."""
    from twinkle.server.observability import dashboard, metrics_route

    app.state.metrics_token = metrics_route.metrics_token(state.config.metrics)
    meter = Meter(state)
    app.state.meter = meter
    state.futures.observers.append(meter.on_finished)
    app.include_router(metrics_route.router)
    app.include_router(dashboard.router)
    app.add_middleware(RequestObserver, meter=meter)
    return meter
