"""TwinkleClient: the connection to a Twinkle server, its session, and run/checkpoint queries.

``init_twinkle_client(base_url, api_key)`` makes one and sets it as the default that the
proxies (``twinkle_client.model.MultiLoraTransformersModel`` and the rest) use. It opens a
session and keeps it alive with a background heartbeat; ``close()`` ends the session,
which frees the LoRA slots of its runs (their checkpoints stay).
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

from twinkle_client.errors import SessionFinishedError, TwinkleClientError
from twinkle_client.http import Transport
from twinkle_client.types import (
    CapacityInfo,
    Checkpoint,
    CheckpointPath,
    TrainingRun,
    TrainingRunsPage,
    WeightsInfo,
)

URL_ENV = "TWINKLE_SERVER_URL"
TOKEN_ENV = "TWINKLE_SERVER_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8000"


class TwinkleClient:
    """One server connection. ``base_url`` and ``api_key`` default to
    ``$TWINKLE_SERVER_URL`` and ``$TWINKLE_SERVER_TOKEN``."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        heartbeat_interval: float = 10.0,
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
        self.transport = transport or Transport(
            self.base_url, key, timeout=timeout, max_retries=max_retries
        )
        self.session_id: str = self.transport.request("POST", "/create_session", {})["session_id"]
        self.last_compute_ms: float | None = None
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(
            target=self._beat, args=(heartbeat_interval,), name="twinkle-heartbeat", daemon=True
        )
        self._heartbeat.start()

    # ---- plumbing -----------------------------------------------------------------------

    def call(self, path: str, body: dict[str, Any]) -> Any:
        """POST to a component route and return its ``result``; ``last_compute_ms`` keeps
        how long the work itself ran on the server."""
        payload = self.transport.request("POST", path, body)
        self.last_compute_ms = payload.get("compute_ms")
        return payload["result"]

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
        """End the session: its runs release their LoRA slots; checkpoints stay."""
        if self._stop.is_set():
            return
        self._stop.set()
        with contextlib.suppress(TwinkleClientError):
            self.transport.request("POST", f"/sessions/{self.session_id}/finish", {}, retries=0)
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
        return self.transport.request("GET", "/get_server_capabilities")

    def get_capacity_info(self) -> CapacityInfo:
        return CapacityInfo.model_validate(self.transport.request("GET", "/capacity"))

    def get_remote_api(self) -> dict[str, dict[str, list[str]]]:
        """The server's table of remotely callable methods (see ``twinkle_client.api``)."""
        return self.transport.request("GET", "/twinkle/api")

    # ---- training runs ------------------------------------------------------------------

    def list_training_runs_with_cursor(self, limit: int = 20, offset: int = 0) -> TrainingRunsPage:
        params = {"limit": limit, "offset": offset}
        page = self.transport.request("GET", "/training_runs", params=params)
        return TrainingRunsPage.model_validate(page)

    def list_training_runs(self, limit: int = 20, offset: int = 0) -> list[TrainingRun]:
        return self.list_training_runs_with_cursor(limit, offset).training_runs

    def get_training_run(self, training_run_id: str) -> TrainingRun:
        return TrainingRun.model_validate(
            self.transport.request("GET", f"/training_runs/{training_run_id}")
        )

    def find_training_run_by_model(self, model: str) -> TrainingRun | None:
        """The most recent of this key's runs whose base model or adapter name is ``model``."""
        found, offset = None, 0
        while True:
            page = self.list_training_runs_with_cursor(limit=100, offset=offset)
            for run in page.training_runs:
                if model in (run.base_model, run.adapter_name):
                    found = run
            offset += len(page.training_runs)
            if not page.training_runs or offset >= page.cursor.total_count:
                return found

    # ---- checkpoints --------------------------------------------------------------------

    def list_checkpoints(self, training_run_id: str) -> list[Checkpoint]:
        body = self.transport.request("GET", f"/training_runs/{training_run_id}/checkpoints")
        return [Checkpoint.model_validate(c) for c in body["checkpoints"]]

    def get_checkpoint_path(self, training_run_id: str, name: str) -> CheckpointPath:
        for checkpoint in self.list_checkpoints(training_run_id):
            if checkpoint.checkpoint_id in (name, f"weights/{name}"):
                return _path(checkpoint)
        raise TwinkleClientError(
            f"training run {training_run_id} has no checkpoint {name!r}",
            status=404,
            category="user",
            code="not_found",
        )

    def get_latest_checkpoint_path(self, training_run_id: str) -> CheckpointPath | None:
        checkpoints = [
            c for c in self.list_checkpoints(training_run_id) if c.checkpoint_type == "training"
        ]
        return _path(checkpoints[-1]) if checkpoints else None

    def delete_checkpoint(
        self, training_run_id_or_path: str, checkpoint_id: str | None = None
    ) -> None:
        """``delete_checkpoint(run_id, 'weights/<name>')``, or with a checkpoint's path."""
        if checkpoint_id is None:
            run_id, _, checkpoint_id = training_run_id_or_path.split("://", 1)[-1].partition("/")
        else:
            run_id = training_run_id_or_path
            if "/" not in checkpoint_id:
                checkpoint_id = f"weights/{checkpoint_id}"
        self.transport.request("DELETE", f"/training_runs/{run_id}/checkpoints/{checkpoint_id}")

    def get_weights_info(self, twinkle_path: str) -> WeightsInfo:
        body = self.transport.request("POST", "/weights_info", {"twinkle_path": twinkle_path})
        return WeightsInfo.model_validate(body)


def _path(checkpoint: Checkpoint) -> CheckpointPath:
    tinker = checkpoint.tinker_path or checkpoint.twinkle_path.replace("twinkle://", "tinker://")
    return CheckpointPath(twinkle_path=checkpoint.twinkle_path, path=tinker)


_default: TwinkleClient | None = None


def init_twinkle_client(
    base_url: str | None = None, api_key: str | None = None, **kwargs: Any
) -> TwinkleClient:
    """Connect, and make this client the default of the proxies."""
    global _default
    _default = TwinkleClient(base_url, api_key, **kwargs)
    return _default


def get_client(client: TwinkleClient | None = None) -> TwinkleClient:
    if client is not None:
        return client
    if _default is None:
        raise TwinkleClientError("no Twinkle client: call init_twinkle_client(base_url, api_key)")
    return _default
