"""The store interface: API keys, sessions, training runs, checkpoints, futures, usage,
telemetry and loss curves.

Every record names its ``owner`` (an API key id), and every read that a request makes
filters by owner, so a tenant cannot see another's records even by guessing ids. A
backend (SQLite now; Postgres or Redis later) implements these methods and nothing else;
the services never write SQL.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ApiKey:
    id: str
    name: str
    key_hash: str
    created_at: float
    revoked_at: float | None = None


@dataclass
class SessionRecord:
    id: str
    owner: str
    created_at: float
    last_heartbeat: float
    closed_at: float | None = None
    model_seq: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainingRun:
    id: str
    owner: str
    session_id: str
    base_model: str
    lora_rank: int
    lora_config: dict[str, Any]
    adapter_name: str
    created_at: float
    last_request_time: float
    active: bool = True
    user_metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckpointRecord:
    run_id: str
    kind: str
    name: str
    owner: str
    path: str
    size_bytes: int
    created_at: float
    has_optimizer: bool = False
    public: bool = False
    """Readable (never writable) by every key that names it by path."""
    expires_at: float | None = None
    """When the server deletes it (seconds since the epoch); None: never."""


@dataclass
class FutureRecord:
    id: str
    owner: str
    operation: str
    status: str  # pending | done | failed
    created_at: float
    idempotency_key: str | None = None
    result: Any = None
    error: dict[str, str] | None = None
    finished_at: float | None = None


@dataclass
class UsageRecord:
    """One metric's total for one key on one UTC day (``YYYY-MM-DD``)."""

    owner: str
    day: str
    metric: str
    amount: float


@dataclass
class TelemetryEvent:
    """One event the Tinker SDK sent to ``/api/v1/telemetry``, kept as it came (``id`` is
    the store's, None until added)."""

    owner: str
    session_id: str | None
    received_at: float
    platform: str | None
    sdk_version: str | None
    event: dict[str, Any]
    id: int | None = None


class Store(ABC):
    """Durable records. Methods taking ``owner`` return only that owner's records."""

    # ---- keys
    @abstractmethod
    def add_key(self, key: ApiKey) -> None: ...

    @abstractmethod
    def key_by_hash(self, key_hash: str) -> ApiKey | None: ...

    @abstractmethod
    def list_keys(self) -> list[ApiKey]: ...

    @abstractmethod
    def revoke_key(self, key_id_or_name: str, when: float) -> bool: ...

    # ---- sessions
    @abstractmethod
    def add_session(self, session: SessionRecord) -> None: ...

    @abstractmethod
    def get_session(self, owner: str, session_id: str) -> SessionRecord | None: ...

    @abstractmethod
    def list_sessions(self, owner: str, limit: int, offset: int) -> list[SessionRecord]: ...

    @abstractmethod
    def touch_session(self, owner: str, session_id: str, when: float) -> bool: ...

    @abstractmethod
    def close_session(self, session_id: str, when: float) -> None: ...

    @abstractmethod
    def next_model_seq(self, session_id: str) -> int: ...

    @abstractmethod
    def expired_sessions(self, before: float) -> list[SessionRecord]: ...

    # ---- training runs
    @abstractmethod
    def add_run(self, run: TrainingRun) -> None: ...

    @abstractmethod
    def get_run(self, owner: str, run_id: str) -> TrainingRun | None: ...

    @abstractmethod
    def list_runs(self, owner: str, limit: int, offset: int) -> tuple[list[TrainingRun], int]: ...

    @abstractmethod
    def touch_run(self, run_id: str, when: float) -> None: ...

    @abstractmethod
    def deactivate_runs(self, run_ids: list[str] | None = None) -> None:
        """Mark runs as holding no LoRA slot (all of them when ``run_ids`` is None)."""

    # ---- checkpoints
    @abstractmethod
    def add_checkpoint(self, record: CheckpointRecord) -> None: ...

    @abstractmethod
    def get_checkpoint(
        self, owner: str, run_id: str, kind: str, name: str
    ) -> CheckpointRecord | None: ...

    @abstractmethod
    def list_checkpoints(self, owner: str, run_id: str | None = None) -> list[CheckpointRecord]: ...

    @abstractmethod
    def delete_checkpoint(self, owner: str, run_id: str, kind: str, name: str) -> bool: ...

    @abstractmethod
    def all_checkpoints(self) -> list[CheckpointRecord]: ...

    @abstractmethod
    def public_checkpoint(self, run_id: str, kind: str, name: str) -> CheckpointRecord | None:
        """A published checkpoint, whoever owns it (the one read that ignores owners)."""

    @abstractmethod
    def set_checkpoint_public(
        self, owner: str, run_id: str, kind: str, name: str, public: bool
    ) -> bool: ...

    @abstractmethod
    def set_checkpoint_expiry(
        self, owner: str, run_id: str, kind: str, name: str, expires_at: float | None
    ) -> bool: ...

    @abstractmethod
    def expired_checkpoints(self, now: float) -> list[CheckpointRecord]: ...

    # ---- futures
    @abstractmethod
    def add_future(self, future: FutureRecord) -> None: ...

    @abstractmethod
    def get_future(self, owner: str, future_id: str) -> FutureRecord | None: ...

    @abstractmethod
    def future_by_idempotency_key(self, owner: str, key: str) -> FutureRecord | None: ...

    @abstractmethod
    def finish_future(
        self, future_id: str, status: str, result: Any, error: dict | None, when: float
    ) -> None: ...

    @abstractmethod
    def fail_pending_futures(self, error: dict[str, str], when: float) -> int:
        """On start-up: futures left pending by a previous process can never finish."""

    @abstractmethod
    def prune_futures(self, before: float) -> int:
        """Forget finished futures older than ``before`` (their results are gone anyway)."""

    # ---- usage and telemetry
    @abstractmethod
    def add_usage(self, owner: str, amounts: dict[str, float], when: float) -> None:
        """Add ``amounts`` (metric -> amount) to the key's totals for ``when``'s UTC day."""

    @abstractmethod
    def usage(self, owner: str | None = None) -> list[UsageRecord]:
        """One key's daily totals, or every key's when ``owner`` is None (the operator)."""

    @abstractmethod
    def add_telemetry(self, events: list[TelemetryEvent]) -> None: ...

    @abstractmethod
    def list_telemetry(self, owner: str, limit: int) -> list[TelemetryEvent]:
        """The key's latest events, newest first."""

    # ---- loss curves
    @abstractmethod
    def add_loss(self, owner: str, run_id: str, when: float, loss: float, keep: int) -> None:
        """Append a point to the run's loss curve, keeping only its latest ``keep`` points."""

    @abstractmethod
    def losses(self, owner: str, run_id: str) -> list[tuple[float, float]]:
        """The run's loss curve, ``(time, loss)`` oldest first (empty for another key's)."""

    @abstractmethod
    def close(self) -> None: ...
