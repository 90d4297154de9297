"""MegatronModel: a Hugging Face checkpoint trained as a Megatron-core GPTModel, same loop.

The model is converted from Hugging Face weights on the fly (each rank reads only
its tensor/pipeline shard; ``convert``), laid out by the DeviceMesh (``layout``),
wrapped in Megatron's DDP (fp32 gradient buffers) and stepped by Megatron's
optimizer. ``forward_backward`` runs Megatron's pipeline schedules over
micro-batches; the twinkle Loss classes run on the last pipeline stage on
per-token logps computed across the tensor-parallel vocabulary slices (``logps``).

The TwinkleModel contract holds as for TransformersModel: losses return sums, and
the step divides the accumulated gradients by the token count of every
micro-batch of every data rank once (Megatron's ``finalize_model_grads`` with
``calculate_per_token_loss``). Results are broadcast from the last pipeline
stage, so every rank returns the same loss, logps and metrics.

``add_adapter_to_model`` trains one LoRA adapter on Megatron's tensor-parallel
linears (``lora``) and a mixture-of-experts model's experts and router
(``lora_experts``), saved as a peft adapter for the Hugging Face model.

Packed (padding-free) batches are accepted and run as right-padded rows (``packed``):
the same maths, without the compute saving, which needs Transformer Engine's attention.
Megatron sequence parallel runs with torch's norms (``layer_spec``); experts can be split
by ep and etp.

Context parallel runs in our own attention (``context_parallel``): each cp rank runs the
model on its chunks of the sequence and the loss sees the whole sequence.

Devices (``device``, else the mesh's device type; see ``device``): a CUDA GPU; an Ascend NPU with
MindSpeed; the CPU on gloo, a debug device for checking a layout with a small model
(``cpu_mode``), chosen when no GPU is visible.

Not supported (each an error that says so): several adapters, left padding and Ulysses
sequence parallel.
megatron-core is imported when a MegatronModel is built, never when this module is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from twinkle.data_format import ModelOutput
from twinkle.infra import get_global_device_mesh, remote_class, remote_function
from twinkle.mesh import DeviceMesh
from twinkle.model.base import TwinkleModel
from twinkle.model.batch_dispatch import slice_dp_rows
from twinkle.model.components import TrainUnitsMixin
from twinkle.model.loss_inputs import align_loss_inputs
from twinkle.model.loss_keywords import check_loss_keywords
from twinkle.model.megatron._require import require_megatron
from twinkle.model.megatron.checkpointing import MegatronCheckpointingMixin
from twinkle.model.megatron.cpu_mode import runs_in_cpu_mode
from twinkle.model.megatron.device import dist_backend, resolve_device
from twinkle.model.megatron.scoring import MegatronScoringMixin
from twinkle.model.precision import resolve_precision
from twinkle.model.train_state import FULL_MODEL, TrainState
from twinkle.module import build_lr_scheduler


@remote_class(execute="all")
@runs_in_cpu_mode
class MegatronModel(
    TrainUnitsMixin, MegatronCheckpointingMixin, MegatronScoringMixin, TwinkleModel
):
    """A Qwen3 / Qwen3-MoE / Qwen2 / Llama causal LM from a hub id, a folder or
    ``bundled://tiny-qwen3``, trained with Megatron-core's tensor, pipeline (and virtual
    pipeline), context, expert and data parallelism as the DeviceMesh says.

    ``mixed_precision='bf16'`` keeps bf16 weights with fp32 master weights in the
    optimizer (Megatron's scheme); 'auto' is bf16 on a GPU and fp32 on a CPU.
    ``use_distributed_optimizer`` shards the optimizer state over data-parallel ranks.
    A folder without weights (the bundled recipe) is a random init from ``seed``, the
    same weights TransformersModel builds from it.
    """

    def __init__(
        self,
        model_id: str | os.PathLike | None = None,
        *,
        config: Any = None,
        device_mesh: DeviceMesh | None = None,
        mixed_precision: str = "auto",
        seed: int = 0,
        device: str | torch.device | None = None,
        use_distributed_optimizer: bool = False,
    ) -> None:
        self.device_mesh = device_mesh or get_global_device_mesh()
        # NOTE: before megatron-core is imported: on an NPU, MindSpeed must patch it first.
        mesh_device = self.device_mesh.device_type if self.device_mesh else "cuda"
        self.device = resolve_device(device, mesh_device)
        require_megatron()
        from twinkle.model.megatron.layout import MegatronLayout

        self.model_id = None if model_id is None else str(model_id)
        self.layout = MegatronLayout.from_mesh(self.device_mesh)
        self.precision = resolve_precision(mixed_precision, self.device.type)
        self.use_distributed_optimizer = bool(use_distributed_optimizer)
        self.seed = seed
        self.lora_config = self.lora_settings = None
        self._build(model_id, config)  # in the CPU mode on a CPU, as every method
        self._states: dict[str, TrainState] = {FULL_MODEL: self._new_state(FULL_MODEL, 1)}
        self._grads_ready = False  # main gradients prepared for the coming optimizer step

    def _build(self, model_id: str | os.PathLike | None, config: Any) -> None:
        """Megatron's process groups, this rank's GPTModel chunks with the HF weights, DDP."""
        from twinkle.model.megatron.build import build_gpt_chunks, load_weights, wrap_ddp
        from twinkle.model.megatron.config import gpt_spec, transformer_config
        from twinkle.model.megatron.layout import initialize_parallel_state
        from twinkle.model.megatron.source import hf_source

        self.hf_config, reader, self.model_dir = hf_source(model_id, config, self.seed)
        self.layout.check_model(self.hf_config)
        self.spec = gpt_spec(self.hf_config, self.layout.tp)
        initialize_parallel_state(self.layout, self.seed, dist_backend(self.device))
        self.config = transformer_config(
            self.spec, self.layout, self.precision, on_accelerator=self.device.type != "cpu"
        )
        chunks = build_gpt_chunks(self.spec, self.config, self.device)
        load_weights(chunks, self.spec, reader)
        self.chunks = wrap_ddp(chunks, self.config, self.use_distributed_optimizer)

    # ---- the adapter and the optimizer ------------------------------------------------

    @remote_function(dispatch="all", collect="first")
    def add_adapter_to_model(
        self, adapter_name: str, config_or_path: Any, gradient_accumulation_steps: int = 1
    ) -> None:
        """Freeze the model and train a LoRA adapter (a peft LoraConfig, or the folder of a
        saved peft adapter) on Megatron's linears; one adapter per MegatronModel."""
        from megatron.core import parallel_state
        from peft import LoraConfig

        from twinkle.model.megatron.build import wrap_ddp
        from twinkle.model.megatron.lora import LoraSettings, inject_lora, load_lora, projections_of
        from twinkle.model.megatron.lora_experts import peft_config_for

        if not isinstance(adapter_name, str) or not adapter_name or adapter_name == FULL_MODEL:
            raise ValueError(f"adapter_name must be a non-empty string, got {adapter_name!r}")
        if self.adapter_names:
            raise ValueError(
                f"this MegatronModel already trains adapter {self.adapter_names[0]!r}; it holds "
                "one adapter (use MultiLoraTransformersModel for several)"
            )
        if self.spec.lora_refused:
            raise ValueError(f"adapter {adapter_name!r}: {self.spec.lora_refused}")
        full = self._states[FULL_MODEL]
        if full.optimizer is not None:
            raise ValueError(
                "set_optimizer was already called for full-parameter training; add the adapter "
                "before setting the optimizer"
            )
        weights = None
        if isinstance(config_or_path, str | os.PathLike) and Path(config_or_path).is_dir():
            from safetensors.torch import load_file

            folder = Path(config_or_path)
            config = LoraConfig.from_pretrained(str(folder))
            weights = load_file(folder / "adapter_model.safetensors")
        elif isinstance(config_or_path, LoraConfig):
            config = config_or_path
        else:
            raise ValueError(
                f"adapter {adapter_name!r}: pass a peft LoraConfig or the folder of a saved "
                f"LoRA adapter; {config_or_path!r} is neither"
            )
        config = peft_config_for(config, self.hf_config)
        settings = LoraSettings.from_peft(config, projections_of(self.spec))
        tp = parallel_state.get_tensor_model_parallel_world_size()
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        modules = [chunk.module for chunk in self.chunks]
        for module in modules:
            inject_lora(module, self.spec, settings, tp, tp_rank, self.seed, self.config)
            if weights is not None:
                load_lora(module, weights, tp, tp_rank)
        self.chunks = wrap_ddp(modules, self.config, self.use_distributed_optimizer)
        self.lora_config, self.lora_settings = config, settings
        state = self._new_state(adapter_name, gradient_accumulation_steps)
        state.loss, state.template, state.processor = full.loss, full.template, full.processor
        state.metrics, state.eval_metrics = full.metrics, full.eval_metrics
        self._states = {adapter_name: state}

    @remote_function(dispatch="all", collect="first")
    def set_optimizer(
        self, optimizer_cls: Any = "AdamW", *, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        """Megatron's optimizer: 'default'/'AdamW' (decoupled weight decay) or 'SGD'; keyword
        arguments use torch's names (lr, weight_decay, betas, eps, momentum)."""
        from twinkle.model.megatron.optimizer import build_megatron_optimizer

        state = self._state(adapter_name)
        state.optimizer = build_megatron_optimizer(
            self.chunks, optimizer_cls, self.precision, self.use_distributed_optimizer, **kwargs
        )
        state.lr_scheduler = None

    @remote_function(dispatch="all", collect="first")
    def set_lr_scheduler(
        self,
        scheduler_cls: Any = "CosineWarmupScheduler",
        *,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Any twinkle/torch scheduler, driving the learning rate of Megatron's inner optimizer."""
        from twinkle.model.megatron.optimizer import SchedulerGroup, torch_optimizers

        state = self._state(adapter_name)
        if state.optimizer is None:
            raise ValueError("set_lr_scheduler needs an optimizer: call set_optimizer(...) first")
        schedulers = [
            build_lr_scheduler(inner, scheduler_cls, **kwargs)
            for inner in torch_optimizers(state.optimizer)
        ]
        state.lr_scheduler = schedulers[0] if len(schedulers) == 1 else SchedulerGroup(schedulers)

    # ---- inputs -------------------------------------------------------------------------

    def _pad_token_id(self) -> int | None:
        return getattr(self.hf_config, "pad_token_id", None)

    def _collate(
        self, inputs: Any, state: TrainState, loss_kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], Callable[[torch.Tensor], torch.Tensor]]:
        """InputFeatures, Trajectories or a collated batch -> (right-padded device tensors,
        the loss arguments to match, and the map of per-token outputs back to the caller's
        layout: the padding Megatron's layout adds is dropped, a packed batch repacked)."""
        from twinkle.model.megatron.packed import is_packed, unpack_rows

        batch = self._batch_of(inputs, state)
        batch = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}
        if is_packed(batch):
            batch, loss_kwargs, restore = unpack_rows(batch, loss_kwargs, self._pad_token_id())
        else:
            _check_right_padded(batch)
            length = batch["input_ids"].shape[1]

            def restore(per_token: torch.Tensor) -> torch.Tensor:
                return per_token[:, :length]

        unpadded = batch["input_ids"].shape[1]
        if self.layout.ep * self.layout.expert_tp > 1 and self.spec.num_experts:
            batch = self._align_for_experts(batch)
        # Sequence parallel splits the sequence evenly over the tensor-parallel ranks, context
        # parallel into 2 × cp equal chunks (each of them split by sequence parallel).
        multiple = (self.layout.tp if self.layout.sequence_parallel else 1) * (
            2 * self.layout.cp if self.layout.cp > 1 else 1
        )
        if multiple > 1:
            current = batch["input_ids"].shape[1]
            batch = _pad_sequence(batch, -(-current // multiple) * multiple, self._pad_token_id())
        loss_kwargs = _pad_per_token(loss_kwargs, unpadded, batch["input_ids"].shape[1])
        return batch, loss_kwargs, restore

    def _align_for_experts(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Expert-parallel and expert-tensor-parallel ranks exchange tokens of one shape:
        right-pad the sequence to the longest of the group."""
        import torch.distributed as dist
        from megatron.core import parallel_state

        group = parallel_state.get_expert_tensor_and_model_parallel_group()
        rows, length = batch["input_ids"].shape
        largest = torch.tensor([rows, length], device=self.device)
        smallest = largest.clone()
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
        dist.all_reduce(smallest, op=dist.ReduceOp.MIN, group=group)
        if largest[0] != smallest[0]:
            raise ValueError(
                f"expert-parallel ranks hold batches of {int(smallest[0])} to {int(largest[0])} "
                "rows; they exchange tokens and need equal rows: give each data rank the same "
                "number of sequences"
            )
        return _pad_sequence(batch, int(largest[1]), self._pad_token_id())

    def _micro_batches(
        self, batch: dict, loss_kwargs: dict, micro_batch_size: int | None
    ) -> list[tuple[dict, dict]]:
        """Equal micro-batches (pipeline stages exchange activations of one fixed shape).

        With virtual pipeline stages, Megatron's interleaved schedule needs a multiple of
        pp_size micro-batches; by default the batch is cut into pp_size of them.
        """
        rows = batch["input_ids"].shape[0]
        pp, interleaved = self.layout.pp, self.layout.vpp is not None
        default = rows // pp if interleaved and rows % pp == 0 else rows
        size = default if micro_batch_size is None else micro_batch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"micro_batch_size must be a positive integer, got {size!r}")
        size = min(size, rows)
        if rows % size:
            raise ValueError(
                f"the batch has {rows} rows, not a multiple of micro_batch_size={size}: Megatron's "
                "pipeline schedules pass micro-batches of one shape; pick a divisor of the rows"
            )
        if interleaved and (rows // size) % pp:
            raise ValueError(
                f"with vpp_size, Megatron's interleaved schedule runs a multiple of pp_size={pp} "
                f"micro-batches; {rows} rows in micro-batches of {size} make {rows // size}: "
                f"pass a batch of a multiple of {pp} rows and a micro_batch_size dividing it"
            )

        def rows_of(values: dict, i: int) -> dict:
            return {
                k: v[i : i + size]
                if (torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == rows)
                or (isinstance(v, list | tuple) and len(v) == rows)
                else v
                for k, v in values.items()
            }

        return [(rows_of(batch, i), rows_of(loss_kwargs, i)) for i in range(0, rows, size)]

    # ---- forward and backward -----------------------------------------------------------

    def _run(
        self, state: TrainState, micro: list[tuple[dict, dict]], forward_only: bool
    ) -> tuple[float, float, torch.Tensor | None]:
        """One pass of Megatron's schedule; (summed loss, tokens, logps) from the last stage."""
        from twinkle.model.megatron.schedule import run_schedule

        return run_schedule(self.chunks, micro, self.spec, state, forward_only)

    @remote_function(dispatch=slice_dp_rows, collect="rows")
    def forward_backward(
        self,
        inputs: Any,
        *,
        adapter_name: str | None = None,
        micro_batch_size: int | None = None,
        **loss_kwargs: Any,
    ) -> ModelOutput:
        """Forward, loss and backward through the pipeline schedule; gradients and the token
        count accumulate until a step. Returns the mean loss over this call's tokens and the
        per-token logps (aligned with the labels), the same on every rank."""
        state = self._state(adapter_name)
        check_loss_keywords(state.loss, loss_kwargs, MegatronModel.forward_backward)
        state.pending_loss = None  # calculate_loss reads the last forward_only alone
        for chunk in self.chunks:
            chunk.train()
        if state.window_start is None:
            state.window_start = time.perf_counter()
        batch, loss_kwargs, restore = self._collate(inputs, state, loss_kwargs)
        loss_kwargs = align_loss_inputs(batch, loss_kwargs)
        micro = self._micro_batches(batch, loss_kwargs, micro_batch_size)
        loss_sum, tokens, logps = self._run(state, micro, forward_only=False)
        if tokens <= 0:
            raise ValueError(
                "the batch has no label tokens (every label is -100), so there is nothing to "
                "train on; check the template's labels or the data"
            )
        logps = restore(logps)
        state.pending_tokens += tokens
        return ModelOutput(loss=loss_sum / tokens, logps=logps, num_tokens=tokens)

    @remote_function(dispatch=slice_dp_rows, collect="rows")
    @torch.no_grad()
    def forward_only(
        self, inputs: Any, *, adapter_name: str | None = None, **loss_kwargs: Any
    ) -> ModelOutput:
        """Forward without gradients: per-token logps, and with labels the loss, which feeds
        the evaluation metrics and ``calculate_loss()``."""
        return self._forward_pass(inputs, adapter_name, loss_kwargs)

    @remote_function(dispatch=slice_dp_rows, collect="rows")
    @torch.no_grad()
    def forward(
        self, inputs: Any, *, adapter_name: str | None = None, **loss_kwargs: Any
    ) -> ModelOutput:
        """The documents' ``actor.forward(input_data)``: the same pass as ``forward_only``.

        Megatron's pipeline schedule runs each micro-batch's backward inside the pass that
        made it, so no graph is kept for a later ``backward()``: train with
        ``forward_backward``."""
        return self._forward_pass(inputs, adapter_name, loss_kwargs)

    @remote_function(dispatch="all", collect="first")
    def backward(self, *, adapter_name: str | None = None) -> None:
        """Refused with the call to use: see ``forward``."""
        raise ValueError(
            "MegatronModel has no separate backward: its pipeline schedule runs forward and "
            "backward together, so call forward_backward(inputs, ...) to train"
        )

    def _forward_pass(
        self, inputs: Any, adapter_name: str | None, loss_kwargs: dict[str, Any]
    ) -> ModelOutput:
        state = self._state(adapter_name)
        check_loss_keywords(state.loss, loss_kwargs, MegatronModel.forward_only)
        for chunk in self.chunks:
            chunk.eval()
        batch, loss_kwargs, restore = self._collate(inputs, state, loss_kwargs)
        micro = self._micro_batches(batch, loss_kwargs, None)
        loss_sum, tokens, logps = self._run(state, micro, forward_only=True)
        logps = restore(logps) if logps.numel() else logps
        loss = loss_sum / tokens if tokens > 0 else None
        state.pending_loss = (loss_sum, tokens) if tokens > 0 else None
        return ModelOutput(loss=loss, logps=logps, num_tokens=tokens if tokens > 0 else None)

    @remote_function(dispatch="all", collect="first")
    def calculate_loss(self, *, adapter_name: str | None = None) -> float:
        """The loss of the last ``forward_only`` (its mean over the label tokens), as the
        documents' evaluation loop reads it: forward_only, calculate_loss,
        calculate_metric(is_training=False). Training runs whole in ``forward_backward``."""
        state = self._state(adapter_name)
        if state.pending_loss is None:
            raise ValueError(
                "calculate_loss needs outputs: call forward_only(inputs) on a batch with labels "
                "first (MegatronModel's forward_backward returns its own loss)"
            )
        loss_sum, tokens = state.pending_loss
        return loss_sum / tokens

    # ---- optimizer steps ----------------------------------------------------------------

    def _require_optimizer(self, state: TrainState, action: str):
        if state.optimizer is None:
            raise ValueError(f"{action} needs an optimizer: call set_optimizer('AdamW', lr=...)")
        return state.optimizer

    def _finalize_gradients(self, state: TrainState) -> None:
        """Reduce gradients over data-parallel ranks (and tied embeddings over stages), then
        divide them by the step's token count: the one normalisation of the contract."""
        from megatron.core.distributed import finalize_model_grads

        if state.pending_tokens <= 0:
            return
        # Megatron sums the count over data × context parallel ranks, and every cp rank
        # counted the whole sequence's tokens.
        count = state.pending_tokens / self.layout.cp
        tokens = torch.tensor(count, dtype=torch.float32, device=self.device)
        finalize_model_grads(self.chunks, num_tokens=tokens)
        state.pending_tokens = 0.0
        self._grads_ready = False

    def _summed_loss_tokens(self) -> float:
        """Each data-parallel rank's share of a global count of 1, for
        ``step_with(normalise=False)``: ``_finalize_gradients`` divides by cp and Megatron
        totals the counts over dp × cp, so the step divides the summed gradient by 1."""
        return 1.0 / self.layout.dp

    def _prepare(self, state: TrainState):
        """Finalised gradients copied into the optimizer's main gradients, once per step."""
        optimizer = self._require_optimizer(state, "the optimizer step")
        self._finalize_gradients(state)
        if not self._grads_ready:
            optimizer.prepare_grads()
            self._grads_ready = True
        return optimizer

    def _clip(self, state: TrainState, max_norm: float) -> float:
        from twinkle.model.megatron.optimizer import clip_gradients

        state.last_grad_norm = clip_gradients(self._prepare(state), max_norm)
        return state.last_grad_norm

    def _step(self, state: TrainState) -> None:
        self._prepare(state).step_with_ready_grads()
        self._grads_ready = False
        state.step += 1

    def _zero_grad(self, state: TrainState) -> None:
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self._require_optimizer(state, "zero_grad").zero_grad()
        state.pending_tokens = 0.0
        self._grads_ready = False

    # ---- reporting ----------------------------------------------------------------------

    @remote_function(dispatch="all", collect="first")
    def calculate_metric(
        self, is_training: bool = True, *, adapter_name: str | None = None
    ) -> dict[str, float]:
        """The metrics since the last call: fed on the last pipeline stage, summed over the
        data-parallel ranks there (each saw its own rows; cp ranks share theirs), sent to all."""
        import torch.distributed as dist
        from megatron.core import parallel_state

        from twinkle.model.megatron.schedule import from_last_stage

        collection = self._metrics(adapter_name, is_training)
        if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
            group = parallel_state.get_data_parallel_group(with_context_parallel=False)
            if dist.get_world_size(group) > 1:

                def summed(tensor: torch.Tensor) -> torch.Tensor:
                    dist.all_reduce(tensor, group=group)
                    return tensor

                collection.reduce_across(summed)
        return from_last_stage(collection.calculate_and_reset())

    @remote_function(dispatch="all", collect="first")
    def get_train_configs(self, *, adapter_name: str | None = None) -> str:
        state = self._state(adapter_name)
        params = [p for chunk in self.chunks for p in chunk.parameters()]
        trainable = sum(p.numel() for p in params if p.requires_grad)
        layout = self.layout
        lines = [
            f"model: {self.model_id or self.spec.model_type} on {self.device} ({self.precision}),"
            " Megatron-core backend",
            f"parallel: tp {layout.tp}, pp {layout.pp}, vpp {layout.vpp or 1}, cp {layout.cp}, "
            f"ep {layout.ep}, dp {layout.dp}",
            f"parameters on this rank: {trainable:,} trainable of "
            f"{sum(p.numel() for p in params):,}",
            f"adapters: {', '.join(self.adapter_names) or 'none (full-parameter training)'}",
            f"optimizer: {type(state.optimizer).__name__ if state.optimizer else 'not set'}"
            f"{' (distributed)' if self.use_distributed_optimizer else ''}",
            f"lr scheduler: {type(state.lr_scheduler).__name__ if state.lr_scheduler else 'none'}",
            f"loss: {type(state.loss).__name__}",
            f"gradient accumulation steps: {state.gradient_accumulation_steps}",
        ]
        return "\n".join(lines)


def _pad_sequence(batch: dict[str, Any], length: int, pad_id: int | None) -> dict[str, Any]:
    """Right-pad every per-token tensor to ``length``; the padding carries label -100 and
    mask 0, so no loss, logp or real token's attention changes."""
    extra = length - batch["input_ids"].shape[1]
    if extra <= 0:
        return batch
    fill = {"labels": -100, "attention_mask": 0, "input_ids": pad_id or 0, "position_ids": 0}
    for key, value in fill.items():
        if key in batch:
            batch[key] = torch.nn.functional.pad(batch[key], (0, extra), value=value)
    return batch


def _pad_per_token(values: dict[str, Any], length: int, padded: int) -> dict[str, Any]:
    """Per-token loss arguments (rows, ``length``, ...) right-padded with zeros to ``padded``,
    to line up with the padded labels (whose -100 keeps the padding out of the loss)."""
    if padded == length:
        return values
    out = {}
    for key, value in values.items():
        if torch.is_tensor(value) and value.dim() >= 2 and value.shape[1] == length:
            extra = value.new_zeros((value.shape[0], padded - length, *value.shape[2:]))
            value = torch.cat([value, extra], dim=1)
        out[key] = value
    return out


def _check_right_padded(batch: Mapping[str, Any]) -> None:
    """Refuse left padding: Megatron's local attention numbers positions from the row start."""
    mask = batch.get("attention_mask")
    if torch.is_tensor(mask) and mask.dim() == 2 and mask.shape[1] > 1:
        starts_padded = (mask[:, 1:] > mask[:, :-1]).any()
        if bool(starts_padded):
            raise ValueError(
                "MegatronModel needs right padding (positions start at 0 on the first token); "
                "use InputProcessor(padding_side='right')"
            )
