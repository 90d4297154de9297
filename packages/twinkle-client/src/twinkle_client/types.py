"""What the client's listing methods return: small pydantic models, printable as JSON."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Checkpoint(_Model):
    checkpoint_id: str
    checkpoint_type: str
    time: str
    twinkle_path: str
    tinker_path: str | None = None
    size_bytes: int | None = None
    has_optimizer: bool = False
    public: bool = False


class TrainingRun(_Model):
    training_run_id: str
    base_model: str
    model_owner: str
    is_lora: bool = True
    lora_rank: int | None = None
    adapter_name: str | None = None
    lora_config: dict[str, Any] = {}
    active: bool = False
    corrupted: bool = False
    last_request_time: str
    last_checkpoint: Checkpoint | None = None
    last_sampler_checkpoint: Checkpoint | None = None
    user_metadata: dict[str, Any] = {}


class Cursor(_Model):
    """Where a page of ``list_training_runs_with_cursor`` sits among all of the key's runs."""

    offset: int
    limit: int
    total_count: int

    @property
    def next_offset(self) -> int | None:
        """The ``offset`` of the next page, or None after the last one."""
        end = self.offset + self.limit
        return end if end < self.total_count else None


class CheckpointPath(_Model):
    """Where a checkpoint lives: ``path`` its folder on the server's filesystem,
    ``twinkle_path`` the URI for Twinkle calls (``model.load``,
    ``sampler.sample(adapter_uri=...)``), ``tinker_path`` the same URI in the ``tinker://``
    form the Tinker SDK takes."""

    path: str
    twinkle_path: str
    tinker_path: str


class SessionInfo(_Model):
    """The server's record of a client session: its metadata and what it holds."""

    session_id: str
    user_metadata: dict[str, Any] = {}
    training_run_ids: list[str] = []
    sampler_ids: list[str] = []


class CapacityInfo(_Model):
    """The server's LoRA pool as this key sees it: ``max_loras`` slots in all, ``used_loras``
    held by this key, ``free_loras`` free in the pool, and ``max_loras_per_key`` this key may
    hold at once (None from a server that sets no quota). This key can add
    ``min(free_loras, max_loras_per_key - used_loras)`` adapters now."""

    max_loras: int
    used_loras: int
    free_loras: int
    max_loras_per_key: int | None = None


class WeightsInfo(_Model):
    base_model: str
    is_lora: bool
    lora_rank: int | None = None
    lora_config: dict[str, Any] = {}
