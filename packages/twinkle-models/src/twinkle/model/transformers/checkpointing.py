"""Checkpoints of a TransformersModel: atomic save, load, exact resume, LoRA merge and export.

A mixin of TransformersModel, kept in its own file so the model file holds the training
step alone; the folder layout and its checks live in ``twinkle.model.checkpoint``.

Under torchrun (DDP, FSDP2, HSDP) every rank calls these methods. The folder is still
written in a temporary sibling and renamed into place, by rank 0, once every rank has
written its files (``shared_atomic_folder``). Under FSDP2 the weights are gathered into
one Hugging Face / peft folder (loadable on any mesh, or none) and the optimizer state is
saved sharded with torch.distributed.checkpoint (resumable on a mesh of as many ranks).
Under expert parallel (with DDP or FSDP2) the folder holds every expert whole, gathered
from the EP ranks, and loading cuts each rank's experts back out of it
(``moe.expert_checkpoint``); the optimizer state goes through
torch.distributed.checkpoint as under FSDP2.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from twinkle.infra import WirePolicy, remote_function
from twinkle.mesh import DeviceMesh
from twinkle.model.checkpoint import (
    OPTIMIZER_DIR,
    OPTIMIZER_FILE,
    RNG_FILE,
    SCHEDULER_FILE,
    TRAINER_STATE,
    CheckpointError,
    CheckpointRecord,
    check_consumed_train_samples,
    check_name,
    library_versions,
    load_state_dict,
    read_record,
    rng_file,
    shared_atomic_folder,
    write_record,
)
from twinkle.model.rng_state import capture_rng_state, restore_rng_state
from twinkle.model.train_state import FULL_MODEL, TrainState
from twinkle.model.transformers.merge import merged_state_dict
from twinkle.model.transformers.moe import gather_expert_weights
from twinkle.model.transformers.moe.expert_checkpoint import (
    local_expert_weights,
    uses_expert_parallel,
)
from twinkle.model.transformers.strategy import ParallelPlan
from twinkle.model.transformers.strategy.state_dict import (
    check_sharded_optimizer,
    load_full_model_state_dict,
    load_sharded_optimizer,
    save_sharded_optimizer,
)
from twinkle.model.transformers.weights import (
    embedding_policy,
    load_adapter_weights,
    load_full_weights,
    read_adapter_weights,
    read_full_weights,
    save_adapter,
    save_full,
)
from twinkle.utils import get_logger

logger = get_logger()
UNIT_RNG = "unit"  # in the RNG file: the unit's own generators (TrainState.random_stream)
SHARDED = "sharded"  # the optimizer state lives in optimizer/, read by torch.distributed.checkpoint


def mesh_label(mesh: DeviceMesh | None) -> str:
    """The mesh's sizes above 1, as a checkpoint records them (``pp=2 × tp=2``), so a resume
    on another layout can name both."""
    if mesh is None:
        return "one process"
    sizes = [(d, mesh.size(d)) for d in mesh.dim_names()] + [("vpp", mesh.vpp_size or 1)]
    label = " × ".join(f"{d}={n}" for d, n in sizes if n > 1)
    return label or "one process"


class CheckpointingMixin:
    """save / load / resume_from_checkpoint / merge_and_export for TransformersModel."""

    @remote_function(dispatch="all", collect="first", wire=WirePolicy())
    def save(
        self,
        name: str,
        output_dir: str | os.PathLike = "output",
        *,
        adapter_name: str | None = None,
        save_optimizer: bool = True,
        consumed_train_samples: int | None = None,
        overwrite: bool = True,
    ) -> str:
        """Write the checkpoint folder ``output_dir/name`` and return its absolute path.

        It holds the adapter (peft's layout) or, with no adapter, the full model as a
        Hugging Face folder usable as ``model_id``; with ``save_optimizer`` the
        optimizer and lr scheduler state; the random states, the step and
        accumulation counters and ``consumed_train_samples`` (pass
        ``dataloader.get_state()['consumed_train_samples']``). The folder appears
        only when complete, and saving again under ``name`` replaces it
        (``overwrite=False`` refuses); ``twinkle.model.checkpoint`` has the layout.
        Saving changes no random state, so a run that saves continues exactly like
        one that does not. Gradients accumulated since the last optimizer step are
        not saved: save right after a step.
        """
        state = self._state(adapter_name)
        final = Path(output_dir) / check_name(name)
        check_consumed_train_samples(consumed_train_samples)
        if state.pending_tokens > 0 or state.accumulated_calls > 0:
            logger.warning(
                f"saving {final} between optimizer steps: the gradients accumulated since the "
                f"last step are not saved, and a resume starts from the last step's weights"
            )
        record = CheckpointRecord(
            kind="full" if state.name == FULL_MODEL else "adapter",
            step=state.step,
            accumulated_calls=state.accumulated_calls,
            gradient_accumulation_steps=state.gradient_accumulation_steps,
            consumed_train_samples=consumed_train_samples,
            model_id=self.model_id,
            versions=library_versions(),
        )
        rng = capture_rng_state(self.device.type)
        if state.random_stream is not None:
            rng[UNIT_RNG] = state.random_stream.state_dict()
        plan = self._distributed_plan()
        sharded = self._sharded_checkpoint()
        # Collectives: the whole tensors (every expert too) arrive on rank 0, the writer.
        weights = plan.full_state_dict() if sharded else None
        adapter_tensors = None
        if plan is not None and plan.pipeline is not None and record.kind == "adapter":
            adapter_tensors = plan.pipeline.adapter_tensors(
                state.name, embedding_policy(self.model, state.name)
            )
        if sharded and record.kind == "full" and uses_expert_parallel(self.model):
            experts = gather_expert_weights(self.model)
            if weights:  # rank 0's; the other ranks' dicts are empty
                weights.update(experts)
        with shared_atomic_folder(
            final, marker=TRAINER_STATE, overwrite=overwrite, distributed=plan is not None
        ) as (folder, writer):
            if writer and record.kind == "adapter":
                record.adapter_name = state.name
                record.adapter_config = save_adapter(
                    self.model, state.name, folder, weights, tensors=adapter_tensors
                )
            elif writer:
                save_full(self._hf_model(), folder, self.model_dir, state_dict=weights)
            if save_optimizer and state.optimizer is not None:
                record.optimizer = type(state.optimizer).__name__
                if sharded:
                    save_sharded_optimizer(
                        self.model, state.optimizer, folder / OPTIMIZER_DIR, plan.optimizer_key
                    )
                    record.optimizer_ranks = dist.get_world_size()
                    record.optimizer_mesh = mesh_label(self.device_mesh)
                elif writer:
                    torch.save(state.optimizer.state_dict(), folder / OPTIMIZER_FILE)
                if state.lr_scheduler is not None:
                    record.lr_scheduler = type(state.lr_scheduler).__name__
                    if writer:
                        torch.save(state.lr_scheduler.state_dict(), folder / SCHEDULER_FILE)
            torch.save(rng, folder / rng_file(self._rank()))
            if writer:
                write_record(folder, record)
        return str(final.absolute())

    def _distributed_plan(self) -> ParallelPlan | None:
        """The parallel plan when the model runs on several ranks, else None."""
        plan = getattr(self, "_plan", None)
        return plan if plan is not None and plan.distributed else None

    def _sharded_checkpoint(self) -> bool:
        """Whether this rank holds only part of the weights (FSDP2, expert parallel): the
        weights are gathered to save and cut to load, the optimizer state goes through
        torch.distributed.checkpoint."""
        plan = self._distributed_plan()
        return plan is not None and (plan.sharded or uses_expert_parallel(self.model))

    def _rank(self) -> int:
        return dist.get_rank() if self._distributed_plan() is not None else 0

    @remote_function(dispatch="all", collect="first", wire=WirePolicy())
    def load(
        self,
        path: str | os.PathLike,
        *,
        adapter_name: str | None = None,
        load_optimizer: bool = False,
    ) -> None:
        """Load the weights of a checkpoint written by ``save``.

        An adapter checkpoint loads into the adapter of its saved name (or
        ``adapter_name``), which is added from the checkpoint when the model lacks
        it; a full checkpoint loads into a model without adapters.
        ``load_optimizer=True`` also restores what ``resume_from_checkpoint``
        restores (optimizer, lr scheduler, counters, random states), with the same
        requirement that the optimizer and scheduler are set up first.
        """
        self._restore_checkpoint(path, adapter_name, training_state=load_optimizer)

    @remote_function(dispatch="all", collect="first", wire=WirePolicy())
    def resume_from_checkpoint(
        self,
        path: str | os.PathLike,
        resume_only_model: bool = False,
        *,
        adapter_name: str | None = None,
    ) -> dict[str, int]:
        """Continue the run that wrote ``path``; returns ``consumed_train_samples`` and ``step``.

        Restores the weights and, unless ``resume_only_model``, the optimizer and lr
        scheduler state, the step and accumulation counters and the random states
        (last), so the next steps reproduce the uninterrupted run's losses bit for
        bit on the same hardware. The state loads into the objects the run sets up:
        call it after ``add_adapter_to_model``, ``set_optimizer`` and
        ``set_lr_scheduler``, as the original run called them (resuming before they
        exist is an error saying so). A full-parameter run builds the model with
        ``model_id=<checkpoint>`` first. The returned values come from the
        checkpoint even with ``resume_only_model``; pass ``consumed_train_samples``
        to ``dataloader.resume_from_checkpoint`` to skip the data already trained on.
        """
        record = self._restore_checkpoint(path, adapter_name, training_state=not resume_only_model)
        consumed = record.consumed_train_samples
        if consumed is None:
            logger.warning(
                f"{path} records no consumed_train_samples (save(..., consumed_train_samples="
                f"dataloader.get_state()['consumed_train_samples']) records it): returning 0"
            )
            consumed = 0
        return {"consumed_train_samples": consumed, "step": record.step}

    @remote_function(dispatch="all", collect="first")
    def merge_and_export(
        self,
        output_dir: str | os.PathLike,
        *,
        adapter_name: str | None = None,
        overwrite: bool = True,
    ) -> str:
        """Write a plain Hugging Face model folder with the adapter merged into the weights.

        The folder (config, safetensors, tokenizer files) loads with
        ``AutoModelForCausalLM`` and as a ``model_id``, without peft. The model
        being trained is left bit for bit as it was (see ``transformers.merge``).
        With no adapter, the full model is written as it is. Returns the path.
        """
        state = self._state(adapter_name)
        plan = self._distributed_plan()
        if self._sharded_checkpoint():
            raise NotImplementedError(
                "merge_and_export of a model sharded by FSDP or expert parallel is not "
                "supported: save() the adapter (one peft folder), then merge it in one "
                "process with TransformersModel(base).add_adapter_to_model(name, folder)"
                ".merge_and_export(...)"
            )
        weights = None if state.name == FULL_MODEL else merged_state_dict(self.model, state.name)
        distributed = plan is not None
        with shared_atomic_folder(
            Path(output_dir), marker="config.json", overwrite=overwrite, distributed=distributed
        ) as (folder, writer):
            if writer:
                save_full(self._hf_model(), folder, self.model_dir, state_dict=weights)
        return str(Path(output_dir).absolute())

    def _restore_checkpoint(
        self, path: str | os.PathLike, adapter_name: str | None, training_state: bool
    ) -> CheckpointRecord:
        """Load the weights and, with ``training_state``, everything else a resume needs."""
        folder, record = read_record(path)
        target = self._checkpoint_target(folder, record, adapter_name)
        saved = self._read_training_state(folder, record, target) if training_state else None
        state = self._load_checkpoint_weights(folder, record, target)
        if saved is not None:
            self._restore_training_state(folder, record, state, saved)
        return record

    def _checkpoint_target(
        self, folder: Path, record: CheckpointRecord, adapter_name: str | None
    ) -> str:
        """The state a checkpoint loads into: FULL_MODEL or an adapter name (maybe new)."""
        if record.kind == "full":
            if adapter_name is not None or self.adapter_names:
                raise CheckpointError(
                    f"{folder} holds a full model, not an adapter; load it into a model "
                    f"without adapters, e.g. TransformersModel(model_id={str(folder)!r})"
                )
            return FULL_MODEL
        if adapter_name is not None:
            return adapter_name
        if record.adapter_name in self._states or not self.adapter_names:
            return record.adapter_name
        raise CheckpointError(
            f"{folder} holds adapter {record.adapter_name!r}, which this model lacks (it has "
            f"{', '.join(self.adapter_names)}): pass adapter_name= to load it into one of them"
        )

    def _read_training_state(
        self, folder: Path, record: CheckpointRecord, target: str
    ) -> dict[str, Any]:
        """The saved optimizer, scheduler and RNG states, once checked to fit this run's set-up:
        a resume that cannot complete fails here, before anything changes."""
        state = self._states.get(target)
        setup = f"set_optimizer(...{'' if target == FULL_MODEL else f', adapter_name={target!r}'})"
        if state is None:
            raise CheckpointError(
                f"resuming {folder} restores the optimizer of adapter {target!r}, which this "
                f"model lacks: call add_adapter_to_model({target!r}, <its LoraConfig>), "
                f"{setup} and set_lr_scheduler(...) as the original run did, then resume (or "
                f"pass resume_only_model=True to restore the weights alone)"
            )
        for kind, saved_cls, current, call in (
            ("optimizer", record.optimizer, state.optimizer, setup),
            ("lr scheduler", record.lr_scheduler, state.lr_scheduler, "set_lr_scheduler(...)"),
        ):
            if saved_cls is not None and type(current).__name__ != saved_cls:
                have = "none" if current is None else type(current).__name__
                raise CheckpointError(
                    f"{folder} holds {saved_cls} {kind} state, and this model's {kind} is {have}: "
                    f"call {call} as the original run did before resume_from_checkpoint (or "
                    f"pass resume_only_model=True to restore the weights alone)"
                )
        own_rng = folder / rng_file(self._rank())
        rng = load_state_dict(own_rng if own_rng.is_file() else folder / RNG_FILE)
        saved = {"rng": rng, "optimizer": None, "scheduler": None}
        sharded = self._sharded_checkpoint()
        here = mesh_label(self.device_mesh if self._distributed_plan() is not None else None)
        saved_mesh = record.optimizer_mesh
        # Pipeline stages save their own parameter groups, so their shards fit only the same
        # stages on the same split; other layouts are checked tensor by tensor below.
        staged = saved_mesh is not None and "pp=" in f"{saved_mesh} {here}"
        if record.optimizer is not None and staged and saved_mesh != here:
            raise CheckpointError(
                f"{folder} holds optimizer state sharded on the mesh {saved_mesh}, "
                f"and this run's mesh is {here}: under pipeline parallel the optimizer's "
                f"shards follow the mesh they were saved on; resume on {saved_mesh}, or pass "
                f"resume_only_model=True to restore the weights alone (they load on any mesh)"
            )
        if record.optimizer is not None and (record.optimizer_ranks is not None or sharded):
            ranks = dist.get_world_size() if sharded else 1
            if record.optimizer_ranks != ranks:
                saved_on = (
                    "one process or DDP (optimizer.pt)"
                    if record.optimizer_ranks is None
                    else f"{record.optimizer_ranks} FSDP / expert-parallel ranks"
                )
                here = f"{ranks} FSDP / expert-parallel ranks" if sharded else "one process or DDP"
                raise CheckpointError(
                    f"{folder} holds optimizer state saved on {saved_on}, and this run is on "
                    f"{here}: resume on the mesh it was saved on, or pass "
                    f"resume_only_model=True to restore the weights alone"
                )
            key = self._distributed_plan().optimizer_key
            check_sharded_optimizer(self.model, state.optimizer, folder / OPTIMIZER_DIR, key)
            saved["optimizer"] = SHARDED
        elif record.optimizer is not None:
            saved["optimizer"] = load_state_dict(folder / OPTIMIZER_FILE)
            sizes = [len(group["params"]) for group in saved["optimizer"]["param_groups"]]
            expected = [len(group["params"]) for group in state.optimizer.param_groups]
            if sizes != expected:
                raise CheckpointError(
                    f"{folder / OPTIMIZER_FILE} holds parameter groups of {sizes} tensors; this "
                    f"optimizer's hold {expected}: train the same parameters as the original run"
                )
        if record.lr_scheduler is not None:
            saved["scheduler"] = load_state_dict(folder / SCHEDULER_FILE)
        return saved

    def _load_checkpoint_weights(
        self, folder: Path, record: CheckpointRecord, target: str
    ) -> TrainState:
        if self._sharded_checkpoint() and target in self._states:
            self._load_sharded_weights(folder, target)
        elif target == FULL_MODEL:
            load_full_weights(self._hf_model(), folder)
        elif target in self._states:
            load_adapter_weights(self.model, target, folder)
        else:
            self.add_adapter_to_model(target, folder, record.gradient_accumulation_steps)
        return self._states[target]

    def _load_sharded_weights(self, folder: Path, target: str) -> None:
        """Whole tensors from the folder into the shards of this rank (every rank reads)."""
        current = set(self.model.state_dict())
        plan = self._distributed_plan()
        if target == FULL_MODEL:
            weights = plan.own_weights(read_full_weights(folder))
            unexpected = sorted(set(weights) - current)
            if unexpected:
                raise CheckpointError(
                    f"{folder} holds tensors this model lacks ({', '.join(unexpected[:5])}): it "
                    f"was saved from another architecture; build the model from it with "
                    f"TransformersModel(model_id={str(folder)!r})"
                )
            weights = local_expert_weights(self.model, weights)
        else:
            saved = read_adapter_weights(self.model, target, folder, part=plan.pipeline is not None)
            # peft saves 'lora_A.weight' for the module key 'lora_A.<adapter>.weight'.
            infix = f".{target}."
            by_saved_name = {k.replace(infix, ".", 1): k for k in current if infix in k}
            weights = {by_saved_name[k]: v for k, v in saved.items()}
        load_full_model_state_dict(self.model, weights)

    def _restore_training_state(
        self, folder: Path, record: CheckpointRecord, state: TrainState, saved: dict[str, Any]
    ) -> None:
        if saved["optimizer"] == SHARDED:
            key = self._distributed_plan().optimizer_key
            load_sharded_optimizer(self.model, state.optimizer, folder / OPTIMIZER_DIR, key)
            state.optimizer.zero_grad(set_to_none=True)
        elif saved["optimizer"] is not None:
            state.optimizer.load_state_dict(saved["optimizer"])
            state.optimizer.zero_grad(set_to_none=True)
        elif state.optimizer is not None:
            logger.warning(f"{folder} holds no optimizer state: the optimizer starts afresh")
        if saved["scheduler"] is not None:
            state.lr_scheduler.load_state_dict(saved["scheduler"])
        if record.gradient_accumulation_steps != state.gradient_accumulation_steps:
            logger.warning(
                f"{folder} was trained with gradient_accumulation_steps="
                f"{record.gradient_accumulation_steps}; continuing with "
                f"{state.gradient_accumulation_steps}"
            )
        state.step, state.accumulated_calls = record.step, record.accumulated_calls
        state.pending_tokens, state.window_start = 0.0, None
        drift = {
            name: (saved_version, current)
            for name, current in library_versions().items()
            if (saved_version := record.versions.get(name, current)) != current
        }
        if drift:
            logger.warning(
                f"{folder} was written with other library versions ({drift}): resumed losses "
                f"may differ from the original run's in the last bits"
            )
        # Last: nothing after it may draw. A unit with generators of its own (a pool's tenant)
        # restores those alone: the process's belong to every unit.
        stream = state.random_stream
        if stream is None:
            restore_rng_state(saved["rng"])
        elif UNIT_RNG in saved["rng"]:
            stream.load_state_dict(saved["rng"][UNIT_RNG])
        else:
            stream.load_process_state(saved["rng"])
