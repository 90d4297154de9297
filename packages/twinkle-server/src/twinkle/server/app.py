"""The FastAPI application: error handling, limits, start-up, and the routers.

``create_app(state)`` serves an already built ServerState (tests build one in process);
``create_app_from_config(config)`` builds it in the background so ``/api/v1/healthz``
answers 503 while the model loads and ``{"status": "ok"}`` once it is ready.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from twinkle.server.config import ServerConfig
from twinkle.server.errors import ApiError
from twinkle.server.limits import BodyLimit
from twinkle.server.sessions import REAP_INTERVAL_S
from twinkle.server.state import ServerState, build_state, load_services
from twinkle.utils import get_logger

logger = get_logger()


class ResultJSONResponse(JSONResponse):
    """The routes' JSON, NaN and infinities written as Python's ``json`` reads them (the
    Twinkle client's decoder): a loss that diverged is an answer, not a failed route.
    Tinker's retrieve_future spells them as strings instead (``tinker.results``)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _json_error(status: int, body: dict[str, str]) -> JSONResponse:
    return JSONResponse(status_code=status, content=body)


def install_error_handlers(app: FastAPI, state: ServerState) -> None:
    home = str(state.home)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        body = exc.body()
        body["error"] = body["error"].replace(home, "<home>")
        return _json_error(exc.status, body)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        )
        return _json_error(422, {"error": problems, "category": "user", "code": "invalid_request"})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        category = "user" if exc.status_code < 500 else "server"
        return _json_error(
            exc.status_code, {"error": str(exc.detail), "category": category, "code": "http"}
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception(f"unexpected error on {request.method} {request.url.path}")
        body = {"error": "internal server error", "category": "server", "code": "internal"}
        return _json_error(500, body)


def create_app(state: ServerState, load_in_background: bool = False) -> FastAPI:
    from twinkle.server import tinker
    from twinkle.server.routes import data, models, runs, service

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if load_in_background:
            threading.Thread(target=_load, args=(state,), daemon=True, name="loader").start()
        reaper = asyncio.create_task(_reap(state))
        try:
            yield
        finally:
            reaper.cancel()

    app = FastAPI(
        title="twinkle-server",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        default_response_class=ResultJSONResponse,
    )
    app.state.twinkle = state
    install_error_handlers(app, state)
    for module in (service, runs, models, data, tinker):
        app.include_router(module.router, prefix="/api/v1")
    app.add_middleware(BodyLimit, max_bytes=state.config.limits.max_body_bytes)
    return app


def create_app_from_config(config: ServerConfig) -> FastAPI:
    return create_app(build_state(config, load_components=False), load_in_background=True)


def _load(state: ServerState) -> None:
    try:
        load_services(state)
        logger.info("twinkle-server is ready")
    except Exception:
        logger.exception("loading the server's components failed")


async def _reap(state: ServerState) -> None:
    while True:
        await asyncio.sleep(REAP_INTERVAL_S)
        try:
            await asyncio.to_thread(state.reap_sessions)
        except Exception:
            logger.exception("reaping expired sessions failed")
