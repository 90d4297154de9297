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
from twinkle.server.plugins import (
    AllowedPlugin,
    load_allowed_plugins,
    plugin_list_problems,
    unresolved,
)

BUNDLED_CONFIG = Path(__file__).parent / "configs" / "cpu_tiny.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BatchingConfig(_Strict):
    """Tenants sharing passes: runs' forward_backward requests one pass of the model
    (``tenant_batches``), keys' sample requests one batch of the sampler (``SamplerService``)."""

    enabled: bool = True
    max_tenants: int = Field(default=16, ge=1)
    """The most requests (one per run) in one pass."""
    max_rows: int = Field(default=256, ge=1)
    """The most rows in one pass (a request over it still runs, alone)."""
    linger_ms: float = Field(default=5.0, ge=0, le=1000)
    """How long a pass waits for a run of the last pass that has not sent its next request."""


class ModelConfig(_Strict):
    model_id: str = "bundled://tiny-qwen3"
    max_loras: int = Field(default=4, ge=1)
    max_rank: int = Field(default=32, ge=1)
    device: str | None = None
    mixed_precision: str = "auto"
    seed: int = 0
    remote_group: str | list[str] = "model"
    """In ``mode: ray``, the device group whose workers hold the model. A list names several
    groups: one copy of the base model on each, each with ``max_loras`` slots of its own and
    its own worker thread, so runs on different copies train at the same time (a new run goes
    to the copy holding the fewest runs)."""
    batching: BatchingConfig = Field(default_factory=BatchingConfig)

    def groups(self) -> list[str]:
        """The device groups holding a copy of the model, in order."""
        return [self.remote_group] if isinstance(self.remote_group, str) else self.remote_group

    @model_validator(mode="after")
    def _groups_distinct(self) -> ModelConfig:
        groups = self.groups()
        if not groups or len(set(groups)) != len(groups):
            raise ValueError(
                f"model.remote_group must name one group or distinct groups, got {groups!r}"
            )
        return self


class SamplerConfig(_Strict):
    enabled: bool = True
    kind: Literal["torch", "vllm"] = "torch"
    max_cached_adapters: int = Field(default=8, ge=1)
    max_tokens: int = Field(default=1024, ge=1)
    """Tokens one completion may generate (``max_tokens``), on both sampler routes."""
    engine_args: dict[str, Any] = Field(default_factory=dict)
    remote_group: str = "sampler"
    """In ``mode: ray``, the device group whose workers hold the sampler."""


class AllowList(_Strict):
    losses: list[str] = [
        "CrossEntropyLoss",  # the models chunk their head themselves: no ChunkedCrossEntropyLoss
        "GRPOLoss",
        "GSPOLoss",
        "CISPOLoss",
        "SAPOLoss",
        "BNPOLoss",
        "DRGRPOLoss",
        "PPOLoss",
        "DecoupledPPOLoss",  # prox_logps: the tenant's forward_only logps before the update
        "DPOLoss",
        "SimPOLoss",
        "CPOLoss",
        "ORPOLoss",
        "GKDLoss",  # teacher_logits travel as a tensor, bounded by limits.max_tensor_elements
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
    plugins: list[AllowedPlugin] = Field(default_factory=list)
    """Hub plugins whose components the lists above may name as ``id:ClassName``, each
    pinned to a revision and sha256 (see ``twinkle.server.plugins``)."""

    @model_validator(mode="after")
    def _plugins_pinned(self) -> AllowList:
        problems = plugin_list_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class Limits(_Strict):
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    request_timeout_s: float = Field(default=600.0, gt=0)
    requests_per_minute: int = Field(default=6000, ge=1)
    session_ttl_s: float = Field(default=120.0, gt=0)
    """Silence after which a session is released when its client never said how often it
    beats; the most any session may stay silent."""
    session_heartbeat_grace_s: float = Field(default=20.0, ge=0)
    """How long past a missed heartbeat a session that declared its period (every Tinker
    SDK session: 10 s) is kept: its LoRA slots free this soon after its script ends."""
    max_batch_rows: int = Field(default=256, ge=1)
    """Rows (sequences, Tinker datums, prompts) in one request."""
    max_sequence_tokens: int = Field(default=32768, ge=1)
    """Tokens in one row (a Tinker datum's model input, a prompt)."""
    max_num_samples: int = Field(default=64, ge=1)
    """Completions one sample request asks for per prompt (``num_samples``)."""
    max_sample_sequences: int = Field(default=1024, ge=1)
    """Completions one sample request generates in all (its prompts × ``num_samples``), so
    that one request cannot hold the sampler for minutes while other keys wait."""
    max_tensor_elements: int = Field(default=4 * 1024 * 1024, ge=1)
    """Values one tensor of a request may hold: its shape's product (a sparse tensor's dense
    size), checked before anything is allocated."""
    max_json_depth: int = Field(default=32, ge=4, le=512)
    """How deeply a JSON body may nest (``[[[...]]]``); Python's parser would run out of
    stack long before the body limit."""
    max_datasets_per_key: int = Field(default=8, ge=1)
    max_loras_per_key: int | None = Field(default=None, ge=1)
    """LoRA slots one key may hold at once. None (the default) is a fair share: half the
    pool, rounded up (``ceil(max_loras / 2)``), so one key never holds every slot while
    another waits, and a pool of one still serves its key. Set it to ``max_loras`` to let
    one key take the whole pool."""
    max_checkpoint_ttl_s: int = Field(default=10 * 365 * 24 * 3600, ge=1)
    """The longest TTL a checkpoint may be given (Tinker's own bound: ten years)."""
    download_link_ttl_s: int = Field(default=900, ge=1)
    """How long a signed download link (an archive, an exported file) stays valid."""


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


class ServeConfig(_Strict):
    """``mode: http``: the Ray Serve ingress that runs the FastAPI app (one replica: see
    ``twinkle.server.serve``)."""

    max_ongoing_requests: int = Field(default=256, ge=1)
    """Requests the replica takes at once; Serve's default (5) would queue one tenant's
    long calls in front of every other tenant's at the proxy."""
    num_cpus: float = Field(default=0.0, ge=0)
    """CPUs the ingress reserves; it only routes and encodes, the groups hold the compute."""


class MetricsConfig(_Strict):
    """Who may read ``GET /metrics`` (the chosen default: anyone who reaches the port, as a
    Prometheus scrape without credentials expects; keep the port inside the cluster)."""

    auth: Literal["open", "token"] = "open"
    """``open``: no credentials. ``token``: only ``Authorization: Bearer <token>`` (in
    Prometheus, ``authorization: {credentials_file: ...}``); an API key does not do."""
    token_env: str = "TWINKLE_METRICS_TOKEN"
    """With ``auth: token``, the environment variable holding the token, read at start-up
    (the secret stays out of the config file)."""


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    mode: Literal["embedded", "ray", "http"] = "embedded"
    """``embedded``: everything in the uvicorn process. ``ray``: uvicorn here, the model and
    sampler on Ray device groups. ``http``: the same components, behind a Ray Serve ingress."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    processor_enabled: bool = True
    allow: AllowList = Field(default_factory=AllowList)
    limits: Limits = Field(default_factory=Limits)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    device_groups: list[DeviceGroupConfig] = Field(default_factory=list)
    ray_init_kwargs: dict[str, Any] = Field(default_factory=dict)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    @model_validator(mode="after")
    def _groups_for_ray(self) -> ServerConfig:
        if self.mode == "embedded":
            if len(self.model.groups()) > 1:
                raise ValueError(
                    f"model.remote_group lists {len(self.model.groups())} groups: copies of "
                    "the model on several groups need mode: ray (or http); in mode: embedded "
                    "name one group or leave it out"
                )
            return self
        names = {group.name for group in self.device_groups}
        needed = set(self.model.groups()) | (
            {self.sampler.remote_group} if self.sampler.enabled else set()
        )
        missing = sorted(needed - names)
        if missing:
            raise ValueError(
                f"mode: {self.mode} places components on device_groups; add groups named "
                f"{missing} "
                "(e.g. {name: model, ranks: 1, device_type: cpu})"
            )
        return self


def load_config(path: str | Path | None = None, **overrides: Any) -> ServerConfig:
    """Read and check a YAML config (the bundled CPU one when ``path`` is None); top-level
    ``overrides`` that are not None (``host``, ``port``) replace the file's values."""
    return ServerConfig.model_validate(read_config_data(path, **overrides))


def read_config_data(path: str | Path | None = None, **overrides: Any) -> dict[str, Any]:
    """The YAML mapping with ``overrides`` applied, not yet checked (a launcher may add the
    device groups ``twinkle.initialize`` recorded before it checks)."""
    source = Path(path) if path is not None else BUNDLED_CONFIG
    if not source.is_file():
        raise FileNotFoundError(f"config file {source} does not exist")
    data = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: the config must be a YAML mapping, got {type(data).__name__}")
    data.update({key: value for key, value in overrides.items() if value is not None})
    return data


def dump_config(config: ServerConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def check_allow_lists(config: ServerConfig) -> list[str]:
    """Names in the allow-lists that no registry knows (a typo would only fail at request time)."""
    from twinkle.loss import LOSSES
    from twinkle.module.optimizer import OPTIMIZERS
    from twinkle.module.scheduler import LR_SCHEDULERS
    from twinkle.preprocessor import PREPROCESSORS
    from twinkle.template.registry import TEMPLATES

    problems = load_allowed_plugins(config.allow.plugins)
    for what, names, registry in (
        ("losses", config.allow.losses, LOSSES),
        ("optimizers", config.allow.optimizers, OPTIMIZERS),
        ("lr_schedulers", config.allow.lr_schedulers, LR_SCHEDULERS),
        ("templates", config.allow.templates, TEMPLATES),
        ("preprocessors", config.allow.preprocessors, PREPROCESSORS),
    ):
        problems += [f"allow.{what}: {problem}" for problem in unresolved(names, registry)]
    problems += [
        f"allow.processors: unknown name {n!r}"
        for n in config.allow.processors
        if n != "InputProcessor"
    ]
    return problems
