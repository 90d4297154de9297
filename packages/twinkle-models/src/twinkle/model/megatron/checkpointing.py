"""Checkpoints of a MegatronModel: Hugging Face weights plus each rank's training state.

The folder is the one ``twinkle.model.checkpoint`` describes for a full model, so
its weights load anywhere a Hugging Face folder does (TransformersModel, vLLM, or
a MegatronModel under any other layout), plus Megatron's training state::

    <name>/config.json, model-0000s-of-0000p.safetensors (one file per pipeline stage),
           model.safetensors.index.json, tokenizer files
    <name>/megatron/layout.json          tp, pp, vpp, cp, ep, dp, distributed_optimizer;
                                         optimizer and scheduler classes
    <name>/megatron/rank_XXXXX.pt        this rank's optimizer (its shard, with the
                                         distributed optimizer), scheduler and RNG states
    <name>/rng_state.pt, trainer_state.json (written last)

With a LoRA adapter the weights are peft's adapter folder instead
(``adapter_config.json``, ``adapter_model.safetensors``), loadable onto the Hugging
Face model with ``PeftModel.from_pretrained``; ``export_hf`` writes the merged model.

Every rank writes into one temporary folder that rank 0 created and renames into
place after a barrier, so ``<name>`` appears only complete. Optimizer state is
per rank, so a full resume needs the same layout; a different one is refused
with what differs, and ``resume_only_model=True`` restores the weights alone.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from twinkle.infra import remote_function
from twinkle.model.checkpoint import (
    RNG_FILE,
    TRAINER_STATE,
    CheckpointError,
    CheckpointRecord,
    check_consumed_train_samples,
    check_name,
    library_versions,
    load_state_dict,
    read_record,
    shared_atomic_folder,
    write_record,
)
from twinkle.model.megatron.optimizer import load_optimizer_state, optimizer_state
from twinkle.model.rng_state import capture_rng_state, restore_rng_state
from twinkle.model.train_state import FULL_MODEL
from twinkle.model.transformers.weights import TOKENIZER_PATTERNS
from twinkle.utils import get_logger

logger = get_logger()
STATE_DIR = "megatron"
LAYOUT_FILE = "layout.json"
LAYOUT_KEYS = ("tp", "pp", "vpp", "cp", "ep", "dp")
DISTRIBUTED_OPTIMIZER = "distributed_optimizer"


def _rank_file(folder: Path, rank: int) -> Path:
    return folder / STATE_DIR / f"rank_{rank:05d}.pt"


def _jsonable(value: Any) -> Any:
    return sorted(value) if isinstance(value, set) else str(value)


class MegatronCheckpointingMixin:
    """save / load / resume_from_checkpoint / export_hf for MegatronModel."""

    def _layout_record(self) -> dict[str, Any]:
        """What the per-rank optimizer shards depend on: the parallel sizes and whether the
        optimizer state is sharded over data-parallel ranks."""
        record = {key: getattr(self.layout, key) for key in LAYOUT_KEYS}
        record[DISTRIBUTED_OPTIMIZER] = self.use_distributed_optimizer
        return record

    def _hf_weights(self) -> dict[str, torch.Tensor]:
        """This pipeline stage's weights as full Hugging Face tensors (TP gathered)."""
        from megatron.core import parallel_state

        from twinkle.model.megatron.convert import gather_hf_weights

        group = parallel_state.get_tensor_model_parallel_group()
        weights: dict[str, torch.Tensor] = {}
        for chunk in self.chunks:
            weights.update(gather_hf_weights(chunk.module, self.spec, group))
        return weights

    def _lora_weights(self) -> dict[str, torch.Tensor]:
        """This pipeline stage's LoRA weights under peft's names (TP gathered)."""
        from megatron.core import parallel_state

        from twinkle.model.megatron.lora import gather_lora

        group = parallel_state.get_tensor_model_parallel_group()
        weights: dict[str, torch.Tensor] = {}
        for chunk in self.chunks:
            weights.update(gather_lora(chunk.module, group))
        return weights

    def _write_adapter(self, folder: Path) -> dict[str, Any]:
        """peft's adapter folder (every stage's LoRA gathered to rank 0); returns its config."""
        import torch.distributed as dist
        from safetensors.torch import save_file

        stages: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(stages, self._lora_weights())
        config = copy.deepcopy(self.lora_config)
        config.target_modules = set(self.lora_settings.targets)
        config.base_model_name_or_path = self.model_id
        if dist.get_rank() == 0:
            weights = {k: v for stage in stages for k, v in stage.items()}
            save_file(weights, folder / "adapter_model.safetensors", {"format": "pt"})
            config.save_pretrained(str(folder))
        return json.loads(json.dumps(config.to_dict(), default=_jsonable))

    def _write_hf(self, folder: Path) -> None:
        import torch.distributed as dist
        from megatron.core import parallel_state

        from twinkle.model.megatron.convert import write_hf_folder

        weights = self._hf_weights()
        if self.lora_settings is not None:
            from twinkle.model.megatron.lora import merged_hf_weights

            weights = merged_hf_weights(weights, self._lora_weights(), self.lora_settings)
        stage = parallel_state.get_pipeline_model_parallel_rank()
        stages = parallel_state.get_pipeline_model_parallel_world_size()
        names: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(names, (stage, sorted(weights)))
        names_by_stage = [
            sorted({n for s, ns in names if s == i for n in ns}) for i in range(stages)
        ]
        writer = (
            parallel_state.get_tensor_model_parallel_rank() == 0
            and parallel_state.get_data_parallel_rank(with_context_parallel=True) == 0
        )
        write_hf_folder(weights, self.hf_config, folder, stage, stages, writer, names_by_stage)
        source = self.model_dir
        if writer and stage == 0 and source is not None and Path(source).is_dir():
            for pattern in TOKENIZER_PATTERNS:
                for path in Path(source).glob(pattern):
                    if path.is_file() and not (folder / path.name).exists():
                        shutil.copy2(path, folder / path.name)

    @remote_function(dispatch="all", collect="first")
    def export_hf(self, output_dir: str | os.PathLike, *, overwrite: bool = True) -> str:
        """Write the model as a plain Hugging Face folder (transformers and vLLM load it),
        with the LoRA adapter, when there is one, merged into the weights."""
        final = Path(output_dir).absolute()
        with shared_atomic_folder(
            final, marker="config.json", overwrite=overwrite, distributed=True
        ) as (folder, _):
            self._write_hf(folder)
        return str(final)

    @remote_function(dispatch="all", collect="first")
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
        """Write the checkpoint folder ``output_dir/name`` (see the module docstring)."""
        import torch.distributed as dist

        state = self._state(adapter_name)
        final = Path(output_dir).absolute() / check_name(name)
        check_consumed_train_samples(consumed_train_samples)
        if state.pending_tokens > 0 or state.accumulated_calls > 0:
            logger.warning(
                f"saving {final} between optimizer steps: the gradients accumulated since the "
                "last step are not saved"
            )
        optimizer = state.optimizer if save_optimizer else None
        scheduler = state.lr_scheduler if optimizer is not None else None
        rank_state = {
            "optimizer": optimizer_state(optimizer) if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": capture_rng_state(self.device.type),
        }
        layout = self._layout_record()
        layout.update(
            optimizer=type(optimizer).__name__ if optimizer is not None else None,
            lr_scheduler=type(scheduler).__name__ if scheduler is not None else None,
        )
        adapter = state.name != FULL_MODEL
        with shared_atomic_folder(
            final, marker=TRAINER_STATE, overwrite=overwrite, distributed=True
        ) as (folder, _):
            adapter_config = self._write_adapter(folder) if adapter else None
            if not adapter:
                self._write_hf(folder)
            (folder / STATE_DIR).mkdir(exist_ok=True)
            torch.save(rank_state, _rank_file(folder, dist.get_rank()))
            if dist.get_rank() == 0:
                (folder / STATE_DIR / LAYOUT_FILE).write_text(json.dumps(layout, indent=2))
                torch.save(rank_state["rng"], folder / RNG_FILE)
            dist.barrier()  # every file is written before the record marks the folder complete
            if dist.get_rank() == 0:
                record = CheckpointRecord(
                    kind="adapter" if adapter else "full",
                    adapter_name=state.name if adapter else None,
                    adapter_config=adapter_config,
                    step=state.step,
                    accumulated_calls=state.accumulated_calls,
                    gradient_accumulation_steps=state.gradient_accumulation_steps,
                    consumed_train_samples=consumed_train_samples,
                    model_id=self.model_id,
                    versions=library_versions(),
                )
                write_record(folder, record)
        return str(final)

    @remote_function(dispatch="all", collect="first")
    def load(
        self,
        path: str | os.PathLike,
        *,
        adapter_name: str | None = None,
        load_optimizer: bool = False,
    ) -> None:
        """Load a checkpoint's weights (any layout); ``load_optimizer`` as a full resume."""
        self._restore(path, adapter_name, training_state=load_optimizer)

    @remote_function(dispatch="all", collect="first")
    def resume_from_checkpoint(
        self,
        path: str | os.PathLike,
        resume_only_model: bool = False,
        *,
        adapter_name: str | None = None,
    ) -> dict[str, int]:
        """Continue the run that wrote ``path``; returns ``consumed_train_samples`` and ``step``.

        A full resume needs the optimizer and scheduler set up as the original run did and
        the same parallel layout; ``resume_only_model=True`` restores the weights alone,
        under any layout (they are stored in Hugging Face format).
        """
        record = self._restore(path, adapter_name, training_state=not resume_only_model)
        return {"consumed_train_samples": record.consumed_train_samples or 0, "step": record.step}

    def _restore(
        self, path: str | os.PathLike, adapter_name: str | None, training_state: bool
    ) -> CheckpointRecord:
        import torch.distributed as dist
        from megatron.core import parallel_state

        from twinkle.model.megatron.convert import HFWeightReader, load_hf_weights

        folder, record = read_record(path)
        if record.kind == "adapter" and not self.adapter_names:
            # A saved LoRA run's adapter is added from the checkpoint, as TransformersModel does.
            self.add_adapter_to_model(
                adapter_name or record.adapter_name, folder, record.gradient_accumulation_steps
            )
            state = self._state(None)
        else:
            state = self._state(adapter_name)
            if (record.kind == "adapter") != (state.name != FULL_MODEL):
                what = "a LoRA adapter" if record.kind == "adapter" else "a full model"
                raise CheckpointError(
                    f"{folder} holds {what}, and this model "
                    f"{'trains the full model' if state.name == FULL_MODEL else 'has an adapter'}: "
                    "load it into a MegatronModel set up like the run that saved it"
                )
        saved = self._read_rank_state(folder, state) if training_state else None
        tp = parallel_state.get_tensor_model_parallel_world_size()
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        if record.kind == "adapter":
            from safetensors.torch import load_file

            from twinkle.model.megatron.lora import load_lora

            weights = load_file(folder / "adapter_model.safetensors")
            for chunk in self.chunks:
                load_lora(chunk.module, weights, tp, tp_rank)
        else:
            reader = HFWeightReader(folder=folder)
            for chunk in self.chunks:
                load_hf_weights(chunk.module, self.spec, reader, tp_rank, tp)
        if state.optimizer is not None:
            state.optimizer.reload_model_params()
        if saved is not None:
            if saved["optimizer"] is not None:
                load_optimizer_state(state.optimizer, saved["optimizer"])
            if saved["scheduler"] is not None:
                state.lr_scheduler.load_state_dict(saved["scheduler"])
            state.step, state.accumulated_calls = record.step, record.accumulated_calls
            state.pending_tokens, state.window_start = 0.0, None
            for chunk in self.chunks:
                chunk.zero_grad_buffer()
            restore_rng_state(saved["rng"])
        dist.barrier()
        return record

    def _read_rank_state(self, folder: Path, state) -> dict[str, Any]:
        """This rank's saved training state, after checking the layout and set-up match."""
        import torch.distributed as dist

        layout_file = folder / STATE_DIR / LAYOUT_FILE
        if not layout_file.is_file():
            raise CheckpointError(
                f"{folder} holds no Megatron training state ({STATE_DIR}/{LAYOUT_FILE}): it was "
                "not saved by a MegatronModel; pass resume_only_model=True to load its weights"
            )
        saved_layout = json.loads(layout_file.read_text())
        # Checkpoints written before the distributed optimizer was recorded used the plain one.
        saved_layout.setdefault(DISTRIBUTED_OPTIMIZER, False)
        differs = {
            k: (saved_layout.get(k), v)
            for k, v in self._layout_record().items()
            if saved_layout.get(k) != v
        }
        if differs:
            described = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in differs.items())
            raise CheckpointError(
                f"{folder} was saved under another parallel layout ({described}): the optimizer "
                "state is sharded per rank and cannot move; pass resume_only_model=True to "
                "restore the weights (stored in Hugging Face format, any layout) and start the "
                "optimizer afresh"
            )
        for kind, attr, call in (
            ("optimizer", "optimizer", "set_optimizer(...)"),
            ("lr_scheduler", "lr_scheduler", "set_lr_scheduler(...)"),
        ):
            saved_cls, current_obj = saved_layout.get(kind), getattr(state, attr)
            if saved_cls is not None and type(current_obj).__name__ != saved_cls:
                have = "none" if current_obj is None else type(current_obj).__name__
                raise CheckpointError(
                    f"{folder} holds {saved_cls} {kind} state and this model's is {have}: call "
                    f"{call} as the original run did before resume_from_checkpoint"
                )
        return load_state_dict(_rank_file(folder, dist.get_rank()))
