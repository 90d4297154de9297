"""Futures: every unit of work a request starts, owned by a key, deduplicated by idempotency key.

A request submits work and gets a future id; the Twinkle routes wait for it within the
request timeout and answer with its result, and (later) Tinker's ``retrieve_future`` polls
it. The status lives in the store; results stay in memory, bounded, since a restarted
server cannot finish the work anyway (pending futures are failed at start-up).

A retried request carrying the same ``X-Idempotency-Key`` gets the first request's future
back, so a forward_backward whose answer was lost on the network is not run twice.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from twinkle.server.errors import ApiError, NotFound, Timeout, as_api_error
from twinkle.server.scheduler import Batchable, FairWorker
from twinkle.server.store import FutureRecord, Store
from twinkle.utils import get_logger

logger = get_logger()
RESTART_ERROR = {
    "error": "the server restarted before this request finished; submit it again",
    "category": "server",
    "code": "lost",
}


class Gone(ApiError):
    """A future whose result the server no longer holds. 410 is final for the Tinker SDK's
    poll (a training future fails at once; a sample is resubmitted whole) and for the
    Twinkle client, where a 5xx would be retried until the client's own timeout."""

    status, category, code = 410, "server", "gone"


class Lost(Gone):
    """A future that was pending when the server stopped: its work never finished."""

    code = "lost"


class RecordedFailure(ApiError):
    """A failed future whose error is known only from the store (its result was dropped):
    the original status category and message, a 4xx for a user's mistake. Tinker's poll
    answers its body with 200 like any failure (``RequestFailedError``, final)."""

    def __init__(self, body: dict[str, str]) -> None:
        super().__init__(body.get("error", "the request failed"))
        self.category = body.get("category", "server")
        self.code = body.get("code", "internal")
        self.status = 400 if self.category == "user" else 500


class FutureManager:
    def __init__(self, store: Store, keep: int = 4096) -> None:
        self.store = store
        self.keep = keep
        self._live: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()
        # Called as (owner, operation, lane, result) when work finishes well (usage, metrics).
        self.observers: list[Callable[[str, str, str | None, Any], None]] = []
        lost = store.fail_pending_futures(RESTART_ERROR, time.time())
        if lost:
            logger.warning(f"{lost} request(s) were pending when the server stopped: failed them")

    def submit(
        self,
        owner: str,
        operation: str,
        worker: FairWorker,
        lane: str,
        fn: Callable[[], Any],
        idempotency_key: str | None,
        timeout: float | None,
        batch: Batchable | None = None,
    ) -> str:
        """Queue ``fn`` on ``worker``'s ``lane`` (``batch``: as an item it may share a pass
        with, see ``FairWorker``); returns the future id (an old one on a retry)."""
        with self._lock:
            if idempotency_key:
                existing = self.store.future_by_idempotency_key(owner, idempotency_key)
                if existing is not None:
                    return existing.id
            future_id = "fut-" + secrets.token_hex(12)
            record = FutureRecord(
                id=future_id,
                owner=owner,
                operation=operation,
                status="pending",
                created_at=time.time(),
                idempotency_key=idempotency_key or None,
            )
            self.store.add_future(record)
            future = worker.submit(lane, fn, timeout, batch)
            self._live[future_id] = future
            while len(self._live) > self.keep:
                self._live.popitem(last=False)
        future.add_done_callback(lambda f: self._record(future_id, f, (owner, operation, lane)))
        return future_id

    def reserve(
        self,
        owner: str,
        operation: str,
        idempotency_key: str | None = None,
        lane: str | None = None,
    ) -> tuple[str, Future | None]:
        """A future id now, for work that starts later (the Tinker routes hold a request
        until its seq_id's turn). Returns ``(id, placeholder)``; the placeholder is None when
        the idempotency key names an earlier request, whose id is returned instead. Pass the
        placeholder to ``start`` once the work may run (on ``lane``, which observers see)."""
        with self._lock:
            if idempotency_key:
                existing = self.store.future_by_idempotency_key(owner, idempotency_key)
                if existing is not None:
                    return existing.id, None
            future_id = "fut-" + secrets.token_hex(12)
            self.store.add_future(
                FutureRecord(
                    id=future_id,
                    owner=owner,
                    operation=operation,
                    status="pending",
                    created_at=time.time(),
                    idempotency_key=idempotency_key or None,
                )
            )
            placeholder: Future = Future()
            self._live[future_id] = placeholder
            while len(self._live) > self.keep:
                self._live.popitem(last=False)
        work = (owner, operation, lane)
        placeholder.add_done_callback(lambda f: self._record(future_id, f, work))
        return future_id, placeholder

    @staticmethod
    def start(
        placeholder: Future,
        worker: FairWorker,
        lane: str,
        fn: Callable[[], Any],
        batch: Batchable | None = None,
    ) -> None:
        """Queue a reserved future's work (``batch``: as an item it may share a pass with);
        its outcome resolves the placeholder."""

        def settle(done: Future) -> None:
            if done.cancelled():
                placeholder.set_exception(Timeout("the request was cancelled before it ran"))
            elif done.exception() is not None:
                placeholder.set_exception(done.exception())
            else:
                placeholder.set_result(done.result())

        try:
            worker.submit(lane, fn, batch=batch).add_done_callback(settle)
        except RuntimeError as exc:  # the worker stopped: the server is shutting down
            placeholder.set_exception(exc)

    @staticmethod
    def fail(placeholder: Future, error: BaseException) -> None:
        placeholder.set_exception(error)

    async def poll(self, owner: str, future_id: str, timeout: float) -> Future | None:
        """Wait up to ``timeout`` s for a future (never cancelling it): the finished future,
        or None when it is still pending. 410 when the server no longer holds it."""
        future = self._held(owner, future_id, Gone)
        if not future.done():
            await asyncio.wait({asyncio.wrap_future(future)}, timeout=timeout)
        return future if future.done() else None

    def _held(self, owner: str, future_id: str, lost: type[ApiError]) -> Future:
        """The caller's future still held in memory; its recorded error if it failed and was
        dropped; else ``lost`` (404 for the Twinkle routes, 410 for Tinker's polls)."""
        record = self.store.get_future(owner, future_id)
        if record is None:
            raise NotFound(f"no request {future_id!r}")
        future = self._live.get(future_id)
        if future is None:
            if record.status == "failed" and record.error:
                if record.error.get("code") == RESTART_ERROR["code"]:
                    raise Lost(record.error.get("error", RESTART_ERROR["error"]))
                raise RecordedFailure(record.error)
            raise lost(
                f"the result of request {future_id!r} is no longer held (the server restarted "
                "or dropped old results); submit the request again"
            )
        return future

    def _record(self, future_id: str, future: Future, work: tuple[str, str, str | None]) -> None:
        if future.cancelled():
            error = Timeout("the request timed out before it ran and was cancelled").body()
            self.store.finish_future(future_id, "failed", None, error, time.time())
            return
        exc = future.exception()
        if exc is None:
            self.store.finish_future(future_id, "done", None, None, time.time())
            for observer in self.observers:
                try:
                    observer(*work, future.result())
                except Exception:  # noqa: BLE001 - counting must never fail the request
                    logger.exception(f"observing request {future_id} failed")
        else:
            body = _error_body(exc)
            if body["category"] == "server" and not isinstance(exc, ApiError):
                logger.error(f"request {future_id} failed on the server", exc_info=exc)
            self.store.finish_future(future_id, "failed", None, body, time.time())

    async def wait(self, owner: str, future_id: str, timeout: float | None) -> Any:
        """The future's result, raising its error as its answer (``errors.as_api_error``);
        ``Timeout`` (and a cancel of queued work) when it does not finish in time."""
        future = self._held(owner, future_id, NotFound)
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout)
        except TimeoutError:
            cancelled = future.cancel()
            note = "it was cancelled before it ran" if cancelled else "it is still running"
            raise Timeout(
                f"request {future_id} did not finish within {timeout:g}s; {note} (a retry with "
                "the same X-Idempotency-Key receives its result)"
            ) from None
        except asyncio.CancelledError:
            raise Timeout(f"request {future_id} was cancelled before it ran") from None
        except Exception as exc:  # its answer; a server fault was logged when it failed
            answer = as_api_error(exc)
            if answer is exc:
                raise
            raise answer from None

    def status(self, owner: str, future_id: str) -> FutureRecord:
        record = self.store.get_future(owner, future_id)
        if record is None:
            raise NotFound(f"no request {future_id!r}")
        return record


def _error_body(exc: BaseException) -> dict[str, str]:
    """A failed future's recorded and polled error: ``errors.as_api_error``, like every
    route's answer."""
    return as_api_error(exc).body()
