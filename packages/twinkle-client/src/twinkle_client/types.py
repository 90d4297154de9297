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
    offset: int
    limit: int
    total_count: int


class TrainingRunsPage(_Model):
    training_runs: list[TrainingRun]
    cursor: Cursor


class CheckpointPath(_Model):
    """Where a checkpoint lives: ``twinkle_path`` for Twinkle calls (``model.load``,
    ``sampler.sample(adapter_uri=...)``), ``path`` the same URI in the ``tinker://`` form
    the Tinker SDK takes."""

    twinkle_path: str
    path: str


class CapacityInfo(_Model):
    max_loras: int
    used_loras: int
    free_loras: int


class WeightsInfo(_Model):
    base_model: str
    is_lora: bool
    lora_rank: int | None = None
    lora_config: dict[str, Any] = {}
