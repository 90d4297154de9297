"""The model service: a MultiLoraTransformersModel whose LoRA slots are tenants' training runs.

A training run is one adapter in the pool, owned by one API key. Its requests run on the
model's FairWorker in the run's lane (in order), interleaved round robin with other runs.
In ``mode: ray`` the model may have several copies, one per group of ``model.remote_group``
(``replicas``): each holds its own slots and runs its runs on its own worker thread.
Components come from the server's allow-lists by name; checkpoints go to a folder the
server picks (``<home>/checkpoints/<key>/<run>/weights/<name>``), written atomically by
the model's ``save``, and are recorded in the store only once complete.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peft import LoraConfig

from twinkle.infra.remote import WirePolicy
from twinkle.model.checkpoint import TRAINER_STATE
from twinkle.model.checkpoint_recovery import pause_point
from twinkle.model.transformers.multi_lora import LoraPoolFullError, MultiLoraTransformersModel
from twinkle.processor import InputProcessor
from twinkle.server import checkpoint_access, tenant_batches
from twinkle.server.auth import Principal
from twinkle.server.checkpoint_recovery import reconcile_checkpoints, run_folder_name
from twinkle.server.checks import number
from twinkle.server.config import ServerConfig
from twinkle.server.errors import (
    ApiError,
    BadRequest,
    CapacityFull,
    Conflict,
    Forbidden,
    NotFound,
    as_api_error,
)
from twinkle.server.model_args import POSITIVE, check_lora_values
from twinkle.server.names import KINDS, CheckpointUri, check_name, parse_uri
from twinkle.server.remote_api import method_spec, parameter_names, wire_methods
from twinkle.server.replicas import ReplicaModels, ReplicaWorkers
from twinkle.server.scheduler import Batchable, FairWorker
from twinkle.server.store import CheckpointRecord, Store, TrainingRun
from twinkle.server.wire import (
    check_allowed,
    decode_inputs,
    decode_value,
    encode,
    plain_kwargs,
    template_kwargs,
)
from twinkle.utils import get_logger

logger = get_logger()
LORA_KEYS = {"r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora"}


TOUCH_EVERY_S = 5.0


@dataclass
class LiveRun:
    run: TrainingRun
    adapter: str
    touched: float = 0.0


class ModelService:
    """Owns the shared base model, its worker and the runs that hold LoRA slots."""

    def __init__(
        self,
        config: ServerConfig,
        store: Store,
        home: Path,
        when_a_slot_frees: Callable[[list[tuple[str, str]]], str] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        # Told to a caller refused a slot, from the (owner, session) of every slot's run.
        self.when_a_slot_frees = when_a_slot_frees or (lambda holders: "try again later")
        self.checkpoints = home / "checkpoints"
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        mc = config.model
        groups = mc.groups() if config.mode == "ray" else [None]
        self.model = ReplicaModels(
            [
                MultiLoraTransformersModel(
                    mc.model_id,
                    max_loras=mc.max_loras,
                    max_rank=mc.max_rank,
                    device=mc.device,
                    mixed_precision=mc.mixed_precision,
                    seed=mc.seed,
                    **({} if group is None else {"remote_group": group}),
                )
                for group in groups
            ]
        )
        self.max_loras = mc.max_loras * len(groups)  # every copy's slots
        # Asked once: in mode ray a call is a round trip that may queue behind training work.
        self.vocab_size: int = self.model.vocab_size()
        self.pad_token_id: int = self.model.pad_token_id()
        self.model_folder: str | None = self.model.model_folder()
        self.workers = max(group_size(config, g) for g in groups) if config.mode == "ray" else 1
        batching = mc.batching
        self.worker = ReplicaWorkers(
            [
                FairWorker(
                    "model" if len(groups) == 1 else f"model-{index}",
                    max_items=batching.max_tenants,
                    max_rows=batching.max_rows,
                    linger_s=batching.linger_ms / 1e3,
                )
                for index in range(len(groups))
            ]
        )
        self.live: dict[str, LiveRun] = {}
        store.deactivate_runs()  # no adapter survives a restart; checkpoints do
        reconcile_checkpoints(store, self.checkpoints)
        # Every method the model offers over HTTP (its @remote_function wire policy); those
        # that build components by name, decode rows or touch the store have a handler here.
        handlers = {
            "set_loss": self._set_loss,
            "set_optimizer": self._set_optimizer,
            "set_lr_scheduler": self._set_lr_scheduler,
            "set_template": self._set_template,
            "set_processor": self._set_processor,
            "forward_backward": self._forward_backward,
            "forward_only": self._forward_only,
            "get_train_configs": self._train_configs,
            "save": self._save,
            "load": self._load,
            "resume_from_checkpoint": self._resume,
        }
        self.methods: dict[str, Callable[..., Any]] = {
            name: handlers.pop(name, None) or self._simple(name, wire)
            for name, wire in wire_methods(MultiLoraTransformersModel).items()
            if not wire.own_route
        }
        if handlers:
            raise RuntimeError(f"handlers for methods not offered over HTTP: {sorted(handlers)}")

    @property
    def base_model(self) -> str:
        return self.config.model.model_id

    def capacity(self, key_id: str) -> dict[str, int]:
        """The pool as one key may see it: its size, the slots this key holds, how many are
        free, and this key's quota; never another key's use."""
        return {
            "max_loras": self.max_loras,
            "used_loras": self.slots_held(key_id),
            "free_loras": self.free_slots(),
            "max_loras_per_key": self.per_key_quota(),
        }

    def free_slots(self) -> int:
        return self.max_loras - len(self.live)

    def free_slots_on(self, replica: int) -> int:
        """Free slots of one copy of the model."""
        held = sum(1 for live in self.live.values() if self.model.holder(live.adapter) == replica)
        return self.config.model.max_loras - held

    def replica_use(self) -> list[dict[str, int]]:
        """Per copy of the model (one without ``mode: ray`` copies): work waiting on its
        worker, whether its worker runs work now, and its LoRA slots used and free."""
        use = []
        for replica, worker in enumerate(self.worker.workers):
            free = self.free_slots_on(replica)
            use.append(
                {
                    "queued": worker.pending(),
                    "busy": 1 if worker.busy_lanes else 0,
                    "used": self.config.model.max_loras - free,
                    "free": free,
                }
            )
        return use

    def slots_held(self, key_id: str) -> int:
        return sum(1 for live in self.live.values() if live.run.owner == key_id)

    def per_key_quota(self) -> int:
        """The slots one key may hold: ``limits.max_loras_per_key``, by default a fair share
        (half the pool, rounded up; see ``Limits``)."""
        max_loras = self.max_loras
        quota = self.config.limits.max_loras_per_key
        return min(quota, max_loras) if quota is not None else math.ceil(max_loras / 2)

    # ---- runs ---------------------------------------------------------------------------

    def lora_config(self, raw: Any) -> LoraConfig:
        """A LoraConfig from the client's JSON, checked against the pool and the allow-list."""
        values = plain_kwargs(raw, "lora_config")
        unknown = set(values) - LORA_KEYS
        if unknown:
            raise BadRequest(
                f"lora_config keys {sorted(unknown)} are not accepted; use {sorted(LORA_KEYS)}"
            )
        check_lora_values(values)
        rank = values.setdefault("r", 8)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise BadRequest(f"lora_config r must be a positive int, got {rank!r}")
        if rank > self.config.model.max_rank:
            raise BadRequest(
                f"LoRA rank {rank} exceeds this server's max_rank {self.config.model.max_rank}"
            )
        targets = values.setdefault("target_modules", "all-linear")
        if not isinstance(targets, str) and not (
            isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets)
        ):
            raise BadRequest(
                "lora_config target_modules must be a module name or a non-empty list of them "
                f"(or 'all-linear'), got {targets!r}"
            )
        for target in [targets] if isinstance(targets, str) else targets:
            check_allowed(target, self.config.allow.lora_target_modules, "LoRA target module")
        try:
            return LoraConfig(**values)
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"invalid lora_config: {exc}") from None

    def create_run(
        self,
        principal: Principal,
        session_id: str,
        run_id: str,
        display_name: str,
        lora: LoraConfig,
        gradient_accumulation_steps: int,
        user_metadata: dict[str, Any],
        seed: int | None = None,
    ) -> TrainingRun:
        """Runs on the worker of the run's copy of the model: take a slot there (its LoRA
        weights drawn from ``seed`` when given), then record the run. A full pool (or copy)
        is a 503 saying when a slot frees (a client retries it); a key at its quota in a pool
        with room is a 403 (not retried: only the key itself can free one of its slots)."""
        with self._placement(run_id) as replica:
            if self.free_slots() <= 0 or self.free_slots_on(replica) <= 0:
                holders = [(live.run.owner, live.run.session_id) for live in self.live.values()]
                where = (
                    f"all {self.max_loras} LoRA slots are"
                    if self.free_slots() <= 0
                    else f"the {self.config.model.max_loras} LoRA slots of copy {replica} (this "
                    "run's) are all"
                )
                raise CapacityFull(f"{where} in use; " + self.when_a_slot_frees(holders))
            quota, held = self.per_key_quota(), self.slots_held(principal.key_id)
            if held >= quota:
                raise Forbidden(
                    f"this key holds {held} LoRA slots and its quota (limits.max_loras_per_key) is "
                    f"{quota}: remove one of its adapters (remove_adapter) or end a session"
                )
            adapter = "t" + secrets.token_hex(8)
            self.model.place(adapter, replica)
            try:
                if seed is None:
                    self.model.add_adapter_to_model(adapter, lora, gradient_accumulation_steps)
                else:
                    self.model.add_seeded_adapter(
                        adapter, lora, gradient_accumulation_steps, seed=seed
                    )
            except LoraPoolFullError as exc:
                raise CapacityFull(str(exc)) from None
            now = time.time()
            run = TrainingRun(
                id=run_id,
                owner=principal.key_id,
                session_id=session_id,
                base_model=self.base_model,
                lora_rank=int(lora.r),
                lora_config=lora_summary(lora),
                adapter_name=display_name,
                created_at=now,
                last_request_time=now,
                user_metadata=user_metadata,
            )
            try:
                self.store.add_run(run)
            except Exception:
                self.model.remove_adapter(adapter)
                raise
            self.live[run_id] = LiveRun(run, adapter)
            return run

    @contextlib.contextmanager
    def _placement(self, run_id: str) -> Iterator[int]:
        """The copy of the model whose thread creates the run; it stops counting the run
        when the create fails."""
        try:
            yield self.worker.replica_of(run_id)
        except BaseException:
            if run_id not in self.live:
                self.worker.forget(run_id)
            raise

    def release(self, run_id: str) -> None:
        """Runs on the worker: free the run's slot (saving nothing)."""
        live = self.live.pop(run_id, None)
        if live is not None:
            self.model.remove_adapter(live.adapter)
            self.store.deactivate_runs([run_id])
            self.worker.forget(run_id)

    def live_run(self, principal: Principal, run_id: str) -> LiveRun:
        """The caller's run holding a slot: 404 for another key's or an unknown run."""
        run = self.store.get_run(principal.key_id, run_id)
        if run is None:
            raise NotFound(f"no training run {run_id!r}")
        live = self.live.get(run_id)
        if live is None:
            raise Conflict(
                f"training run {run_id!r} holds no LoRA slot any more (its session ended or the "
                "server restarted): add a new adapter and load one of its checkpoints"
            )
        return live

    def call(self, principal: Principal, live: LiveRun, method: str, args: dict[str, Any]) -> Any:
        """Runs on the worker: one allow-listed method of the model for this run. What the
        model refuses in the request (``errors.as_api_error``: an ``old_logps`` row of the
        wrong length, a loss without its inputs) is a 400 whose message names the method."""
        handler = self.methods.get(method)
        if handler is None:
            raise NotFound(f"unknown model method {method!r}")
        try:
            return self.run_for(live, lambda: handler(principal, live, **args))
        except Exception as exc:
            raise self.answer_error(method, exc) from None

    @staticmethod
    def answer_error(method: str, exc: Exception) -> Exception:
        """What a request of ``method`` that raised ``exc`` answers: an ApiError as it is, a
        user's mistake as a 400 naming the method, a server fault as itself."""
        if isinstance(exc, ApiError):
            return exc
        answer = as_api_error(exc)
        return BadRequest(f"{method}: {answer.message}") if answer.category == "user" else exc

    def batchable(
        self, principal: Principal, live: LiveRun, method: str, args: dict[str, Any]
    ) -> Batchable | None:
        """The request as an item of a pass shared with other runs (``tenant_batches``), or
        None when it runs alone."""
        return tenant_batches.batchable(self, principal, live, method, args)

    def run_for(self, live: LiveRun, fn: Callable[[], Any]) -> Any:
        """Runs on the worker: ``fn`` for a run still holding its slot (the Tinker routes'
        work comes through here too)."""
        if live.run.id not in self.live:
            raise Conflict(f"training run {live.run.id!r} was released")
        now = time.time()
        if now - live.touched > TOUCH_EVERY_S:  # a write per request would cost more than it says
            self.store.touch_run(live.run.id, now)
            live.touched = now
        return fn()

    # ---- components by name ----------------------------------------------------------------

    def _set_loss(self, principal, live, loss: Any = None, **kwargs) -> None:
        name = check_allowed(loss, self.config.allow.losses, "loss")
        self.model.set_loss(name, adapter_name=live.adapter, **plain_kwargs(kwargs, name))

    def _set_optimizer(self, principal, live, optimizer_cls: Any = "AdamW", **kwargs) -> None:
        name = check_allowed(optimizer_cls, self.config.allow.optimizers, "optimizer")
        self.model.set_optimizer(name, adapter_name=live.adapter, **plain_kwargs(kwargs, name))

    def _set_lr_scheduler(
        self, principal, live, scheduler_cls: Any = "CosineWarmupScheduler", **kwargs
    ) -> None:
        name = check_allowed(scheduler_cls, self.config.allow.lr_schedulers, "lr scheduler")
        self.model.set_lr_scheduler(name, adapter_name=live.adapter, **plain_kwargs(kwargs, name))

    def _set_template(self, principal, live, template: Any = None, **kwargs) -> None:
        name = check_allowed(template, self.config.allow.templates, "template")
        kwargs = template_kwargs(kwargs, name, self.base_model)
        self.model.set_template(name, adapter_name=live.adapter, **kwargs)

    def _set_processor(self, principal, live, processor: Any = None, **kwargs) -> None:
        check_allowed(processor, self.config.allow.processors, "processor")
        kwargs = plain_kwargs(kwargs, "InputProcessor")
        multiple = kwargs.get("pad_to_multiple_of")
        if isinstance(multiple, int) and multiple > self.config.limits.max_sequence_tokens:
            raise BadRequest("pad_to_multiple_of exceeds this server's max_sequence_tokens")
        kwargs.setdefault("pad_token_id", self.pad_token_id)
        self.model.set_processor(InputProcessor(**kwargs), adapter_name=live.adapter)

    # ---- training -----------------------------------------------------------------------

    def _batch(self, inputs: Any) -> list:
        return decode_inputs(inputs, self.config.limits)

    def _forward_backward(self, principal, live, inputs: Any = None, **kwargs) -> Any:
        batch = self._batch(inputs)
        kwargs = {key: decode_value(value) for key, value in kwargs.items()}
        output = self.model.forward_backward(batch, adapter_name=live.adapter, **kwargs)
        return output.to_dict()

    def _forward_only(self, principal, live, inputs: Any = None, **kwargs) -> Any:
        batch = self._batch(inputs)
        kwargs = {key: decode_value(value) for key, value in kwargs.items()}
        output = self.model.forward_only(batch, adapter_name=live.adapter, **kwargs)
        return output.to_dict()

    def _simple(self, method: str, wire: WirePolicy) -> Callable[..., Any]:
        """A method whose plain JSON arguments go to the model as they are, its ``positive``
        numbers checked first."""
        names = set(parameter_names(method_spec(getattr(MultiLoraTransformersModel, method), wire)))

        def handler(principal, live, **kwargs) -> Any:
            unknown = set(kwargs) - names
            if unknown:
                raise BadRequest(f"{method} takes no argument(s) {sorted(unknown)}")
            kwargs = plain_kwargs(kwargs, method)
            for name in wire.positive:
                if name in kwargs:
                    number(kwargs[name], f"{method} {name}", **POSITIVE)
            return encode(getattr(self.model, method)(adapter_name=live.adapter, **kwargs))

        return handler

    def _train_configs(self, principal, live) -> str:
        """The model's summary, naming this run's adapter alone (not the other tenants')."""
        lines = self.model.get_train_configs(adapter_name=live.adapter).splitlines()
        own = f"adapters: {live.run.adapter_name} (training run {live.run.id})"
        return "\n".join(own if line.startswith("adapters:") else line for line in lines)

    # ---- checkpoints --------------------------------------------------------------------

    def checkpoint_folder(self, owner: str, uri: CheckpointUri) -> Path:
        return self.checkpoints / owner / run_folder_name(uri.run_id) / uri.kind / uri.name

    def _save(
        self,
        principal,
        live,
        name: Any = None,
        save_optimizer: bool = True,
        consumed_train_samples: int | None = None,
        overwrite: bool = True,
        kind: str = "weights",
    ) -> str:
        """Save the run's adapter as ``<kind>/<name>``: ``weights`` for a resumable checkpoint,
        ``sampler_weights`` for weights a sampler loads (Tinker's save_weights_for_sampler)."""
        if kind not in KINDS:
            raise BadRequest(f"checkpoint kind must be one of {KINDS}, got {kind!r}")
        uri = CheckpointUri(live.run.id, kind, check_name(name))
        folder = self.checkpoint_folder(principal.key_id, uri)
        folder.parent.mkdir(parents=True, exist_ok=True)
        self.model.save(
            uri.name,
            folder.parent,
            adapter_name=live.adapter,
            save_optimizer=bool(save_optimizer),
            consumed_train_samples=consumed_train_samples,
            overwrite=bool(overwrite),
        )
        pause_point("unrecorded", folder)  # a kill test's window: saved, not yet recorded
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        self.store.add_checkpoint(
            CheckpointRecord(
                run_id=uri.run_id,
                kind=uri.kind,
                name=uri.name,
                owner=principal.key_id,
                path=str(folder),
                size_bytes=size,
                created_at=time.time(),
                has_optimizer=bool(save_optimizer),
            )
        )
        return str(uri)

    def owned_checkpoint(self, principal: Principal, path: Any) -> CheckpointRecord:
        """A checkpoint to read (load, resume, sample): the caller's own or a published one."""
        record = checkpoint_access.readable(self.store, principal, path)
        if not (Path(record.path) / TRAINER_STATE).is_file():
            raise NotFound(f"no checkpoint {path}")
        return record

    def _load(self, principal, live, path: Any = None, load_optimizer: bool = False) -> None:
        record = self.owned_checkpoint(principal, path)
        self.model.load(record.path, adapter_name=live.adapter, load_optimizer=bool(load_optimizer))

    def _resume(self, principal, live, path: Any = None, resume_only_model: bool = False) -> Any:
        record = self.owned_checkpoint(principal, path)
        return self.model.resume_from_checkpoint(
            record.path, bool(resume_only_model), adapter_name=live.adapter
        )

    def delete_checkpoint(self, principal: Principal, run_id: str, checkpoint_id: str) -> None:
        uri = parse_uri(f"twinkle://{run_id}/{checkpoint_id}")
        record = self.store.get_checkpoint(principal.key_id, uri.run_id, uri.kind, uri.name)
        if record is None:
            raise NotFound(f"no checkpoint {uri}")
        self.store.delete_checkpoint(principal.key_id, uri.run_id, uri.kind, uri.name)
        shutil.rmtree(record.path, ignore_errors=True)

    def stop(self) -> None:
        self.worker.stop()


def group_size(config: ServerConfig, name: str) -> int:
    """How many workers hold the model (each a data-parallel rank) in ``mode: ray``."""
    ranks = next(g.ranks for g in config.device_groups if g.name == name)
    return ranks if isinstance(ranks, int) else len(ranks)


def lora_summary(lora: LoraConfig) -> dict[str, Any]:
    """The client-settable part of a LoraConfig, as JSON (no server paths)."""
    summary = {key: getattr(lora, key) for key in sorted(LORA_KEYS)}
    targets = summary["target_modules"]
    summary["target_modules"] = sorted(targets) if isinstance(targets, set) else targets
    return summary
