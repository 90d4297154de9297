"""TwinkleClient: the connection to a Twinkle server, its session, and run/checkpoint queries.

Constructing one (or calling ``init_twinkle_client``, the same thing) sets it as the shared
context the proxies (``twinkle_client.model.MultiLoraTransformersModel`` and the rest) use
when built without ``client=``. It opens a session, keeps it alive with a background
heartbeat, and ends it with ``close()``, which also runs at interpreter exit; ending the
session frees the LoRA slots of its runs (their checkpoints stay).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
from typing import Any
from urllib.parse import quote

from twinkle_client import checkpoints_io
from twinkle_client._keywords import keywords
from twinkle_client.errors import NotFoundError, SessionFinishedError, TwinkleClientError
from twinkle_client.http import Transport
from twinkle_client.types import (
    CapacityInfo,
    Checkpoint,
    CheckpointPath,
    Cursor,
    SessionInfo,
    TrainingRun,
    WeightsInfo,
)

URL_ENV = "TWINKLE_SERVER_URL"
TOKEN_ENV = "TWINKLE_SERVER_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_ROUTE_PREFIX = "/twinkle"
"""Where twinkle-server serves the component routes (``/api/v1/twinkle/model/...``)."""
CLOSE_TIMEOUT_S = 10.0
"""How long ``close()`` waits for the server: it also runs at exit, which must not hang."""
PAGE = 100


class TwinkleClient:
    """One server connection. ``base_url`` and ``api_key`` default to
    ``$TWINKLE_SERVER_URL`` and ``$TWINKLE_SERVER_TOKEN``; ``route_prefix`` is where the
    server serves the component routes; ``session_metadata`` (JSON) is stored with the
    session on the server. ``heartbeat_interval`` is the former name of
    ``session_heartbeat_interval``."""

    @keywords("TwinkleClient", heartbeat_interval="session_heartbeat_interval")
    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        route_prefix: str = DEFAULT_ROUTE_PREFIX,
        session_heartbeat_interval: float = 10.0,
        session_metadata: dict[str, Any] | None = None,
        max_retries: int = 3,
        timeout: float = 660.0,
        transport: Transport | None = None,
    ) -> None:
        self.base_url = base_url or os.environ.get(URL_ENV) or DEFAULT_URL
        key = api_key if api_key and api_key != "EMPTY_TOKEN" else os.environ.get(TOKEN_ENV)
        if not key:
            raise TwinkleClientError(
                f"no API key: pass api_key= or set ${TOKEN_ENV} (the operator issues keys "
                "with `twinkle-server keys create --name NAME`)"
            )
        self.route_prefix = _route_prefix(route_prefix)
        interval = _interval(session_heartbeat_interval)
        metadata = _metadata(session_metadata)
        self.transport = transport or Transport(
            self.base_url, key, timeout=timeout, max_retries=max_retries
        )
        try:
            if self.route_prefix != DEFAULT_ROUTE_PREFIX:
                self._check_route_prefix()
            # The declared period lets the server release a session soon after its beats stop.
            body = {"user_metadata": metadata, "heartbeat_interval_s": interval}
            answer = self.transport.request("POST", "/create_session", body)
        except BaseException:
            self.transport.close()
            raise
        self.session_id: str = answer["session_id"]
        self.session_metadata: dict[str, Any] = answer.get("user_metadata", metadata)
        self.last_compute_ms: float | None = None
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(
            target=self._beat, args=(interval,), name="twinkle-heartbeat", daemon=True
        )
        self._heartbeat.start()
        atexit.register(self.close)
        _set_default(self)

    # ---- plumbing -----------------------------------------------------------------------

    def call(self, route: str, body: dict[str, Any]) -> Any:
        """POST to a component route (``/model/step``, under ``route_prefix``) and return its
        ``result``; ``last_compute_ms`` keeps how long the work itself ran on the server."""
        payload = self.transport.request("POST", self.route_prefix + route, body)
        self.last_compute_ms = payload.get("compute_ms")
        return payload["result"]

    def _check_route_prefix(self) -> None:
        try:
            self.transport.request("GET", f"{self.route_prefix}/api")
        except NotFoundError:
            raise TwinkleClientError(
                f"the server at {self.base_url} serves no Twinkle routes under "
                f"route_prefix={self.route_prefix!r}; twinkle-server serves them under "
                f"{DEFAULT_ROUTE_PREFIX!r}, the default",
                status=404,
                category="user",
                code="not_found",
            ) from None

    def _beat(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                body = {"session_id": self.session_id}
                self.transport.request("POST", "/session_heartbeat", body, retries=0)
            except SessionFinishedError:
                return
            except TwinkleClientError:
                continue  # the next beat tries again; the session lasts a few missed beats

    def close(self) -> None:
        """End the session: its runs release their LoRA slots; checkpoints stay. Runs at
        interpreter exit too; a second call does nothing."""
        if self._stop.is_set():
            return
        self._stop.set()
        atexit.unregister(self.close)
        _clear_default(self)
        with contextlib.suppress(TwinkleClientError):
            path = f"/sessions/{self.session_id}/finish"
            self.transport.request("POST", path, {}, retries=0, timeout=CLOSE_TIMEOUT_S)
        self.transport.close()

    def __enter__(self) -> TwinkleClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- server -------------------------------------------------------------------------

    def health_check(self) -> bool:
        """True when the server answers and has finished loading."""
        try:
            return self.transport.request("GET", "/healthz", retries=0).get("status") == "ok"
        except TwinkleClientError:
            return False

    def get_server_capabilities(self) -> dict[str, Any]:
        """The served model (``supported_models``), ``max_loras`` and the allow-lists."""
        return self.transport.request("GET", "/get_server_capabilities")

    def get_capacity_info(self) -> CapacityInfo:
        """The server's LoRA pool as this key sees it: ``max_loras``, ``used_loras`` (this
        key's own), ``free_loras`` (free in the pool) and ``max_loras_per_key``."""
        return CapacityInfo.model_validate(self.transport.request("GET", "/capacity"))

    def get_session(self) -> SessionInfo:
        """This session as the server keeps it: ``user_metadata`` and the runs it holds."""
        body = self.transport.request("GET", f"/sessions/{_segment(self.session_id)}")
        return SessionInfo.model_validate({**body, "session_id": self.session_id})

    def get_remote_api(self) -> dict[str, dict[str, list[str]]]:
        """The server's table of remotely callable methods (see ``twinkle_client.api``)."""
        return self.transport.request("GET", f"{self.route_prefix}/api")

    # ---- training runs ------------------------------------------------------------------

    def list_training_runs_with_cursor(
        self, limit: int = 20, offset: int = 0
    ) -> tuple[list[TrainingRun], Cursor]:
        """``runs, cursor = ...``: one page of this key's runs, oldest first; the next page
        is at ``offset=cursor.next_offset`` (None after the last)."""
        params = {"limit": limit, "offset": offset}
        page = self.transport.request("GET", "/training_runs", params=params)
        runs = [TrainingRun.model_validate(run) for run in page["training_runs"]]
        return runs, Cursor.model_validate(page["cursor"])

    def list_training_runs(self, limit: int = 20, offset: int = 0) -> list[TrainingRun]:
        return self.list_training_runs_with_cursor(limit, offset)[0]

    @keywords("TwinkleClient", training_run_id="run_id")
    def get_training_run(self, run_id: str) -> TrainingRun:
        return TrainingRun.model_validate(
            self.transport.request("GET", f"/training_runs/{_segment(run_id)}")
        )

    @keywords("TwinkleClient", model="base_model")
    def find_training_run_by_model(self, base_model: str) -> list[TrainingRun]:
        """All of this key's runs on ``base_model``, oldest first; the hub prefix is optional
        (``'Qwen/Qwen3.5-4B'`` finds runs on ``'ms://Qwen/Qwen3.5-4B'``)."""
        wanted = _without_hub(base_model)
        found: list[TrainingRun] = []
        offset: int | None = 0
        while offset is not None:
            runs, cursor = self.list_training_runs_with_cursor(limit=PAGE, offset=offset)
            found += [run for run in runs if _without_hub(run.base_model) == wanted]
            offset = cursor.next_offset
        return found

    # ---- checkpoints --------------------------------------------------------------------

    @keywords("TwinkleClient", training_run_id="run_id")
    def list_checkpoints(self, run_id: str) -> list[Checkpoint]:
        """The run's checkpoints, oldest first."""
        body = self.transport.request("GET", f"/training_runs/{_segment(run_id)}/checkpoints")
        return [Checkpoint.model_validate(c) for c in body["checkpoints"]]

    @keywords("TwinkleClient", training_run_id="run_id", name="checkpoint_id")
    def get_checkpoint_path(self, run_id: str, checkpoint_id: str) -> CheckpointPath:
        """``checkpoint_id`` as listed (``'weights/<name>'``, ``'sampler_weights/<name>'``)
        or the bare name of a training checkpoint."""
        route = f"/training_runs/{_segment(run_id)}/checkpoints/{_checkpoint_id(checkpoint_id)}"
        return CheckpointPath.model_validate(self.transport.request("GET", route))

    @keywords("TwinkleClient", training_run_id="run_id")
    def get_latest_checkpoint_path(self, run_id: str) -> str | None:
        """The ``twinkle://`` path of the run's newest training checkpoint, ready for
        ``model.load(path)`` or ``model.resume_from_checkpoint(path)``; None if it has none."""
        checkpoints = [c for c in self.list_checkpoints(run_id) if c.checkpoint_type == "training"]
        return checkpoints[-1].twinkle_path if checkpoints else None

    @keywords("TwinkleClient", training_run_id_or_path="run_id")
    def delete_checkpoint(self, run_id: str, checkpoint_id: str | None = None) -> None:
        """``delete_checkpoint(run_id, checkpoint_id)``, or with a checkpoint's
        ``twinkle://`` path alone."""
        if checkpoint_id is None:
            run_id, _, checkpoint_id = run_id.split("://", 1)[-1].partition("/")
        route = f"/training_runs/{_segment(run_id)}/checkpoints/{_checkpoint_id(checkpoint_id)}"
        self.transport.request("DELETE", route)

    def get_weights_info(self, twinkle_path: str) -> WeightsInfo:
        """What a checkpoint holds: ``base_model``, ``is_lora``, ``lora_rank``, ``lora_config``."""
        body = self.transport.request("POST", "/weights_info", {"twinkle_path": twinkle_path})
        return WeightsInfo.model_validate(body)

    # ---- checkpoints in and out (twinkle:// or tinker:// paths) ---------------------------

    def download_checkpoint(self, path: str, output_dir: str | os.PathLike) -> str:
        """Download a checkpoint (yours, or one published) as a plain peft adapter folder:
        ``PeftModel.from_pretrained(base_model, output_dir)`` loads it. Returns the folder."""
        return str(checkpoints_io.download(self.transport, path, output_dir))

    def publish_checkpoint(self, path: str) -> None:
        """Let every key read (load, sample, download) this checkpoint of yours by its path."""
        self.transport.request("POST", f"{checkpoints_io.checkpoint_route(path)}/publish")

    def unpublish_checkpoint(self, path: str) -> None:
        self.transport.request("DELETE", f"{checkpoints_io.checkpoint_route(path)}/publish")

    def set_checkpoint_ttl(self, path: str, ttl_seconds: int | None) -> str | None:
        """Delete the checkpoint ``ttl_seconds`` from now (None: keep it); returns when, ISO."""
        route = f"{checkpoints_io.checkpoint_route(path)}/ttl"
        body = checkpoints_io.ttl_body(ttl_seconds)
        return self.transport.request("PUT", route, body)["expires_at"]

    def import_adapter(self, folder: str | os.PathLike, name: str) -> dict[str, Any]:
        """Upload a peft LoRA adapter folder as the checkpoint ``weights/<name>`` of a new
        run of yours. Returns its ``twinkle_path``/``tinker_path`` and the ``lora_config`` to
        add an adapter with before ``model.load(twinkle_path)`` (a Tinker client starts from
        it with ``create_training_client_from_state(tinker_path)``)."""
        archive = checkpoints_io.pack(folder)
        params = {"name": name}
        return self.transport.upload("/checkpoints/import", archive, params, "application/gzip")

    def push_checkpoint_to_hub(
        self, path: str, repo_id: str, *, token: str | None = None, private: bool = True
    ) -> dict[str, Any]:
        """Push a checkpoint's peft folder to the hub repo ``repo_id`` (created if missing)
        from the server, with ``token`` (used for this push only, never stored)."""
        body = {"repo_id": repo_id, "token": token, "private": private}
        return self.transport.request("POST", f"{checkpoints_io.checkpoint_route(path)}/push", body)


def _route_prefix(prefix: Any) -> str:
    if not isinstance(prefix, str) or not prefix.startswith("/"):
        raise ValueError(f"route_prefix must be a path such as '/twinkle', got {prefix!r}")
    return prefix.rstrip("/") or DEFAULT_ROUTE_PREFIX


def _interval(seconds: Any) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ValueError(
            f"session_heartbeat_interval must be a positive number of seconds, got {seconds!r}"
        )
    return float(seconds)


def _metadata(metadata: Any) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError(f"session_metadata must be a dict, got {type(metadata).__name__}")
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"session_metadata must be JSON (str keys, plain values): {exc}") from None
    return metadata


def _segment(value: Any) -> str:
    """A run or session id as one URL path segment."""
    if not isinstance(value, str) or not value:
        raise TypeError(f"an id must be a non-empty string, got {value!r}")
    return quote(value, safe=":")


def _checkpoint_id(checkpoint_id: Any) -> str:
    """``weights/<name>`` (the bare name of a training checkpoint gets the ``weights/``)."""
    if not isinstance(checkpoint_id, str) or not checkpoint_id:
        raise TypeError(f"checkpoint_id must be a non-empty string, got {checkpoint_id!r}")
    if "/" not in checkpoint_id:
        checkpoint_id = f"weights/{checkpoint_id}"
    return quote(checkpoint_id, safe="/:")


def _without_hub(model_id: str) -> str:
    """``'ms://Qwen/Qwen3.5-4B'`` -> ``'Qwen/Qwen3.5-4B'``: the id without its hub."""
    return model_id.split("://", 1)[-1]


_default: TwinkleClient | None = None
_default_lock = threading.Lock()


def _set_default(client: TwinkleClient) -> None:
    global _default
    with _default_lock:
        _default = client


def _clear_default(client: TwinkleClient) -> None:
    global _default
    with _default_lock:
        if _default is client:
            _default = None


def init_twinkle_client(
    base_url: str | None = None, api_key: str | None = None, **kwargs: Any
) -> TwinkleClient:
    """Connect; the new client becomes the shared context of the proxies (as every new
    ``TwinkleClient`` does). Takes ``TwinkleClient``'s keywords."""
    return TwinkleClient(base_url, api_key, **kwargs)


def get_client(client: TwinkleClient | None = None) -> TwinkleClient:
    """``client``, or the shared context: the ``TwinkleClient`` made last, until it closes."""
    if client is not None:
        return client
    if _default is None:
        raise TwinkleClientError(
            "no Twinkle client: create one first, TwinkleClient(base_url, api_key) or "
            "init_twinkle_client(base_url, api_key)"
        )
    return _default
