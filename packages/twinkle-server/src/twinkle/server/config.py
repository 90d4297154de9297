"""The server's configuration: one YAML file, checked before anything starts.

Everything a client may name comes from here: the model it trains on, and the allow-lists
of losses, optimizers, lr schedulers, templates, processors, preprocessors and datasets
(a client never names a class or a path; it picks from these lists).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from twinkle.server.home import twinkle_home

BUNDLED_CONFIG = Path(__file__).parent / "configs" / "cpu_tiny.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(_Strict):
    model_id: str = "bundled://tiny-qwen3"
    max_loras: int = Field(default=4, ge=1)
    max_rank: int = Field(default=32, ge=1)
    device: str | None = None
    mixed_precision: str = "auto"
    seed: int = 0
    remote_group: str = "model"
    """In ``mode: ray``, the device group whose workers hold the model."""


class SamplerConfig(_Strict):
    enabled: bool = True
    kind: Literal["torch", "vllm"] = "torch"
    max_cached_adapters: int = Field(default=8, ge=1)
    max_tokens: int = Field(default=1024, ge=1)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    remote_group: str = "sampler"
    """In ``mode: ray``, the device group whose workers hold the sampler."""


class AllowList(_Strict):
    losses: list[str] = [
        "CrossEntropyLoss",
        "ChunkedCrossEntropyLoss",
        "GRPOLoss",
        "GSPOLoss",
        "CISPOLoss",
        "DPOLoss",
    ]
    optimizers: list[str] = ["AdamW", "Adam", "SGD", "default"]
    lr_schedulers: list[str] = [
        "CosineWarmupScheduler",
        "LinearWarmupScheduler",
        "LinearLR",
        "ConstantLR",
        "default",
    ]
    templates: list[str] = ["Template", "Qwen3_5Template"]
    processors: list[str] = ["InputProcessor"]
    preprocessors: list[str] = ["SelfCognitionProcessor", "CountdownProcessor", "GSM8KProcessor"]
    datasets: list[str] = ["bundled://self-cognition", "bundled://gsm8k", "bundled://countdown"]
    lora_target_modules: list[str] = [
        "all-linear",
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]


class Limits(_Strict):
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    request_timeout_s: float = Field(default=600.0, gt=0)
    requests_per_minute: int = Field(default=6000, ge=1)
    session_ttl_s: float = Field(default=120.0, gt=0)
    max_batch_rows: int = Field(default=256, ge=1)
    max_sequence_tokens: int = Field(default=32768, ge=1)
    max_datasets_per_key: int = Field(default=8, ge=1)
    max_loras_per_key: int | None = Field(default=None, ge=1)
    """LoRA slots one key may hold at once (None: all of them)."""


class StorageConfig(_Strict):
    home: str | None = None
    database: str | None = None

    def home_path(self) -> Path:
        path = Path(self.home).expanduser() if self.home else twinkle_home()
        path.mkdir(parents=True, exist_ok=True)
        return path

    def database_path(self) -> Path:
        return Path(self.database).expanduser() if self.database else self.home_path() / "state.db"


class DeviceGroupConfig(_Strict):
    name: str
    ranks: int | list[int] = 1
    device_type: str = "cpu"


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    mode: Literal["embedded", "ray"] = "embedded"
    model: ModelConfig = Field(default_factory=ModelConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    processor_enabled: bool = True
    allow: AllowList = Field(default_factory=AllowList)
    limits: Limits = Field(default_factory=Limits)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    device_groups: list[DeviceGroupConfig] = Field(default_factory=list)
    ray_init_kwargs: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _groups_for_ray(self) -> ServerConfig:
        if self.mode != "ray":
            return self
        names = {group.name for group in self.device_groups}
        needed = {self.model.remote_group} | (
            {self.sampler.remote_group} if self.sampler.enabled else set()
        )
        missing = sorted(needed - names)
        if missing:
            raise ValueError(
                f"mode: ray places components on device_groups; add groups named {missing} "
                "(e.g. {name: model, ranks: 1, device_type: cpu})"
            )
        return self


def load_config(path: str | Path | None = None, **overrides: Any) -> ServerConfig:
    """Read and check a YAML config (the bundled CPU one when ``path`` is None); top-level
    ``overrides`` that are not None (``host``, ``port``) replace the file's values."""
    source = Path(path) if path is not None else BUNDLED_CONFIG
    if not source.is_file():
        raise FileNotFoundError(f"config file {source} does not exist")
    data = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: the config must be a YAML mapping, got {type(data).__name__}")
    data.update({key: value for key, value in overrides.items() if value is not None})
    return ServerConfig.model_validate(data)


def dump_config(config: ServerConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
