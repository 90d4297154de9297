"""The FastAPI application: error handling, limits, observability, start-up, and the routers.

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
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from twinkle.server.checkpoint_access import reap_expired
from twinkle.server.config import ServerConfig
from twinkle.server.errors import ApiError, as_api_error
from twinkle.server.limits import BodyLimit
from twinkle.server.observability.requests import current_request_id
from twinkle.server.openai.errors import PREFIX as OPENAI_PREFIX
from twinkle.server.openai.errors import openai_error_body
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


def error_response(exc: BaseException, home: str, path: str = "") -> JSONResponse:
    """The HTTP answer for a request to ``path`` that raised ``exc`` (``errors.as_api_error``),
    server paths hidden, in OpenAI's shape on its routes; a genuine server fault is logged
    with its traceback."""
    answer = as_api_error(exc)
    if answer.status >= 500 and not isinstance(exc, ApiError):
        logger.error(
            f"request_id={current_request_id()} unexpected error: {type(exc).__name__}: {exc}",
            exc_info=exc,
        )
    body = answer.body()
    body["error"] = body["error"].replace(home, "<home>")
    body["request_id"] = current_request_id()
    if path.startswith(OPENAI_PREFIX):
        body = openai_error_body(body, answer.status)
    return JSONResponse(status_code=answer.status, content=body)


class ErrorAnswers:
    """ASGI middleware: every exception a route raises is answered here (a 4xx for the
    caller's mistakes, a 500 for the server's faults) and the request then ends normally.
    Starlette's own last-resort handler re-raises after answering, and uvicorn closes the
    keep-alive connection of a request whose app raised; answered here, none does."""

    def __init__(self, app: ASGIApp, home: str) -> None:
        self.app = app
        self.home = home

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:  # half an answer went out: nothing left to say on this connection
                raise
            await error_response(exc, self.home, scope["path"])(scope, receive, send)


def install_error_handlers(app: FastAPI, state: ServerState) -> None:
    """FastAPI answers its own exceptions (an unknown route, a bad path parameter) before
    any middleware sees them: route those through ``error_response`` too."""
    home = str(state.home)

    async def answer(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc, home, request.url.path)

    app.add_exception_handler(RequestValidationError, answer)
    app.add_exception_handler(StarletteHTTPException, answer)


def create_app(state: ServerState, load_in_background: bool = False) -> FastAPI:
    from twinkle.server import observability, openai, tinker
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
    app.include_router(openai.router, prefix="/v1")
    app.add_middleware(BodyLimit, max_bytes=state.config.limits.max_body_bytes)
    app.add_middleware(ErrorAnswers, home=str(state.home))
    observability.install(app, state)  # outermost: request ids reach every answer
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
        try:
            await asyncio.to_thread(reap_expired, state.store)
        except Exception:
            logger.exception("deleting expired checkpoints failed")
