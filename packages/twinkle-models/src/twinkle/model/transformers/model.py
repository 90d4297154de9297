"""TransformersModel: a Hugging Face causal LM trained by a loop the user writes.

One model holds either the full parameters as its single trainable unit, or
any number of named peft adapters, each with its own optimizer, scheduler,
loss, template, processor, accumulation counter and metrics (a TrainState).
Parallel strategies (DDP, FSDP2/HSDP, sequence and expert parallel) are applied to
the plain model from the DeviceMesh by ``strategy.parallelize``, once, on the first
``set_optimizer`` or forward: every adapter must be added before that under torchrun
(FSDP2 shards the parameters in place and DDP registers them). This class holds no
parallelism logic: it runs forwards through the plan, and asks the plan's hooks
(``ParallelPlan``) how to prepare a batch and finish its outputs, whether this rank
reports the metrics, the global token count, the extra gradient reductions and the
global norm. Embedding training (``task='embedding'``) is ``embedding_model``'s.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import time
from collections.abc import Mapping
from typing import Any

import torch
from peft import PeftConfig, PeftModel, get_peft_model
from transformers import PreTrainedModel

from twinkle.data_format import ModelOutput
from twinkle.infra import WirePolicy, get_global_device_mesh, remote_class, remote_function
from twinkle.loss import chunked_logps, logps_from_logits, prefers_chunked
from twinkle.mesh import DeviceMesh, Platform
from twinkle.model.base import TwinkleModel
from twinkle.model.batch_dispatch import slice_dp_rows
from twinkle.model.components import TrainUnitsMixin
from twinkle.model.embedding import check_pooling
from twinkle.model.loss_inputs import align_loss_inputs
from twinkle.model.loss_keywords import check_loss_keywords
from twinkle.model.precision import autocast, resolve_precision
from twinkle.model.token_ids import check_token_ids
from twinkle.model.train_state import FULL_MODEL, TrainState
from twinkle.model.transformers.checkpointing import CheckpointingMixin
from twinkle.model.transformers.compile import CompiledLayers, compile_options
from twinkle.model.transformers.embedding_model import MODEL_INPUT_KEYS, EmbeddingModelMixin
from twinkle.model.transformers.loading import load_causal_lm
from twinkle.model.transformers.moe.routing_replay import RoutingReplay
from twinkle.model.transformers.packing import AutoPacking
from twinkle.model.transformers.router_aux_loss import (
    record_router_logits,
    router_aux_loss,
    wants_router_aux_loss,
)
from twinkle.model.transformers.scoring import ScoringMixin
from twinkle.model.transformers.strategy import ParallelPlan, parallelize
from twinkle.model.transformers.strategy.pipeline_step import pipeline_pass, refuse_three_calls
from twinkle.model.unit_random import derived_seed, seeded
from twinkle.module import build_lr_scheduler, build_optimizer
from twinkle.patch import apply_for_batch, is_packed_batch
from twinkle.processor import InputProcessor
from twinkle.utils import get_logger

logger = get_logger()
TASKS = ("causal_lm", "embedding")


def _default_device() -> torch.device:
    device_type = Platform.detect_device_type()
    if device_type in ("cuda", "npu"):
        return torch.device(device_type, Platform.get_local_rank())
    return torch.device(device_type)


@remote_class(execute="all")
class TransformersModel(
    TrainUnitsMixin, CheckpointingMixin, EmbeddingModelMixin, ScoringMixin, TwinkleModel
):
    """A causal LM from a hub id, a local folder or a bundled id (``bundled://tiny-qwen3``).

    ``mixed_precision='auto'`` autocasts to bf16 where the device computes it
    fast and stays float32 on a CPU; weights keep their loaded dtype.
    ``gradient_checkpointing`` trades compute for activation memory and is off
    by default. Extra keyword arguments go to ``from_pretrained``.

    ``model_cls`` picks the Hugging Face class (default ``AutoModelForCausalLM``); an
    encoder such as BERT loads with ``model_cls=transformers.AutoModel`` and trains with
    ``task='embedding'`` only. ``embedding_pooling`` ('last', 'mean' or 'cls'; see
    ``twinkle.model.embedding``) is how ``task='embedding'`` turns hidden states into one
    vector per sequence. ``ddp_config`` holds keyword arguments for torch's
    DistributedDataParallel (``{'find_unused_parameters': True}``); they apply when the
    device mesh has dp > 1, and are kept but unused on a single device.

    Under torchrun the device mesh picks the strategy (``strategy.parallelize``): DDP for
    dp alone, FSDP2 for fsdp, HSDP for both; ``expert_parallel`` (an
    ``ExpertParallelConfig``) and ``sequence_parallel`` (a ``SequenceParallelConfig``)
    configure the mesh's ``ep_size`` and ``ulysses_size``; a mesh with ``pp_size`` splits
    the decoder into pipeline stages (``pipeline_parallel``: a ``PipelineConfig`` choosing the
    schedule, the split and the micro-batches; see ``strategy.pipeline``). Losses are
    normalised by the token count of the whole global batch, so every strategy trains like
    one process.

    ``compile=True`` (or a dict of ``torch.compile`` keyword arguments) compiles each decoder
    layer in place (``transformers.compile``): on one process and under DDP; elsewhere, or
    where compilation fails, the layers run eagerly after one warning naming the cause.
    Batches whose rows differ in length by the model's choice run padding-free
    (``transformers.packing``) unless the processor says otherwise.

    ``routing_replay=True`` (a MoE for RL): ``forward_only`` records the experts each router
    chose for its batch, and ``forward``/``forward_backward`` on that batch (or its
    micro-batches) route to them (``moe.routing_replay``); each call's ``routing_replay``
    argument overrides the model's.
    """

    def __init__(
        self,
        model_id: str | os.PathLike | None = None,
        *,
        model_cls: type[PreTrainedModel] | None = None,
        config: Any = None,
        device_mesh: DeviceMesh | None = None,
        mixed_precision: str = "auto",
        gradient_checkpointing: bool = False,
        seed: int = 0,
        device: str | torch.device | None = None,
        embedding_pooling: str = "last",
        ddp_config: Mapping[str, Any] | None = None,
        expert_parallel: Any = None,
        sequence_parallel: Any = None,
        pipeline_parallel: Any = None,
        compile: bool | Mapping[str, Any] = False,
        routing_replay: bool = False,
        **from_pretrained_kwargs: Any,
    ) -> None:
        self._routing = RoutingReplay(routing_replay)
        if ddp_config is not None and not isinstance(ddp_config, Mapping):
            raise TypeError(
                f"ddp_config must be a dict of DistributedDataParallel keyword arguments, got "
                f"{type(ddp_config).__name__}"
            )
        self.embedding_pooling = check_pooling(embedding_pooling)
        self.ddp_config = dict(ddp_config or {})
        self.model_id = None if model_id is None else str(model_id)
        self.device_mesh = device_mesh or get_global_device_mesh()
        self.device = torch.device(device) if device is not None else _default_device()
        self.precision = resolve_precision(mixed_precision, self.device.type)
        self.seed = seed
        model, self.model_dir = load_causal_lm(
            model_id, model_cls, config, seed, **from_pretrained_kwargs
        )
        model.config.use_cache = False
        self.model: PreTrainedModel | PeftModel = model.to(self.device)
        options = compile_options(compile)
        self._compiled = None
        if options is not None:  # the plan's kind decides whether compiled layers are correct
            strategy = lambda: "single" if self._plan is None else self._plan.kind  # noqa: E731
            self._compiled = CompiledLayers(model, options, strategy)
        self.gradient_checkpointing = gradient_checkpointing
        self.expert_parallel, self.sequence_parallel = expert_parallel, sequence_parallel
        self.pipeline_parallel = pipeline_parallel
        self._plan: ParallelPlan | None = None
        self._packing = AutoPacking()
        # Trainable units whose last backward left its gradients unreduced (accumulating).
        self._unreduced: set[str] = set()
        self._states: dict[str, TrainState] = {FULL_MODEL: self._new_state(FULL_MODEL, 1)}
        self._active: str | None = None

    # ---- adapters and per-adapter components -------------------------------------------------

    def _state(self, adapter_name: str | None) -> TrainState:
        """The unit an operation names, made the active one: every operation on an adapter
        (a forward, a step, a save, ...) runs on it in peft too, whichever ran last."""
        state = super()._state(adapter_name)
        self._activate(state)
        return state

    def _activate(self, state: TrainState) -> None:
        """Make ``state``'s adapter the one that runs and receives gradients."""
        if state.name != FULL_MODEL and self._active != state.name:
            self.model.set_adapter(state.name)
        self._active = state.name

    def _parallel(self) -> ParallelPlan:
        """The device mesh's strategies, applied to the model on first use (see the module
        docstring). On one process the plan wraps nothing, and is rebuilt when an adapter
        replaces ``self.model`` by its PeftModel."""
        stale = self._plan is not None and self._plan.model is not self.model
        if self._plan is None or (stale and not self._plan.distributed):
            self._plan = parallelize(
                self.model,
                self.device_mesh,
                precision=self.precision,
                gradient_checkpointing=self.gradient_checkpointing,
                ddp_config=self.ddp_config,
                expert_parallel=self.expert_parallel,
                sequence_parallel=self.sequence_parallel,
                pipeline=self.pipeline_parallel,
            )
        return self._plan

    def _run(self, state: TrainState, fn: Any, batch: dict, *, final_backward: bool | None = None):
        """``fn(batch)`` through the strategy's root, so DDP/FSDP see every forward path.

        ``final_backward`` (training forwards only) says whether this forward's backward is
        the last before the optimizer step: only that one reduces the gradients over the
        ranks; the others accumulate locally (DDP's no_sync, FSDP2's gradient sync off).
        """
        plan = self._parallel()
        if final_backward is not None and torch.is_grad_enabled():
            plan.set_gradient_sync(state.name, final_backward)
            (self._unreduced.discard if final_backward else self._unreduced.add)(state.name)
        stream = state.random_stream
        with stream.drawing() if stream is not None else contextlib.nullcontext():
            return plan.run(state.name, fn, batch)

    @staticmethod
    def _steps_now(state: TrainState) -> bool:
        """Whether the next ``clip_grad_and_step`` call will step the optimizer."""
        return state.accumulated_calls + 1 >= state.gradient_accumulation_steps

    def _train_mode(self) -> None:
        """Put the model in training mode, only when it is not: ``Module.train()`` walks every
        submodule, 2.5 ms a call on a 31M model with LoRA and 9 ms on a 4B one, on each step.
        Modules added later start in training mode; ``forward_only`` still calls ``eval()``
        every time, since an adapter added after it would otherwise stay in training mode."""
        if not self.model.training:
            self.model.train()

    @remote_function(
        dispatch="all",
        collect="first",
        wire=WirePolicy(server_names=("adapter_name",), own_route=True),
    )
    def add_adapter_to_model(
        self,
        adapter_name: str,
        config_or_path: PeftConfig | str | os.PathLike,
        gradient_accumulation_steps: int = 1,
    ) -> None:
        """Add a peft adapter from its config, or from the folder of a saved one.

        A new adapter's weights are drawn from a seed derived from the model's ``seed`` and
        ``adapter_name``: two runs with the same seed and name start from bit-identical
        adapters, and adding one leaves the process's random state as it was.
        """
        self._add_adapter(adapter_name, config_or_path, gradient_accumulation_steps)

    def _add_adapter(
        self,
        adapter_name: str,
        config_or_path: PeftConfig | str | os.PathLike,
        gradient_accumulation_steps: int,
        init_seed: int | None = None,
    ) -> TrainState:
        """``add_adapter_to_model``, its weights drawn from ``init_seed`` when given."""
        if not isinstance(adapter_name, str) or not adapter_name or adapter_name == FULL_MODEL:
            raise ValueError(f"adapter_name must be a non-empty string, got {adapter_name!r}")
        if adapter_name in self._states:
            raise ValueError(f"adapter {adapter_name!r} already exists; pick another name")
        if self._plan is not None and self._plan.distributed:
            raise ValueError(
                f"adapter {adapter_name!r} comes after the model was parallelised "
                f"({self._plan.kind}, on the first set_optimizer or forward): under torchrun add "
                f"every adapter with add_adapter_to_model before calling set_optimizer or training"
            )
        full = self._states.get(FULL_MODEL)
        if full is not None and full.optimizer is not None:
            raise ValueError(
                "set_optimizer was already called for full-parameter training; add adapters "
                "before setting optimizers"
            )
        state = self._new_state(adapter_name, gradient_accumulation_steps)
        if init_seed is None:
            init_seed = self._init_seed(adapter_name)
        try:
            with seeded(init_seed, self.device):
                self._attach_adapter(adapter_name, config_or_path)
        except ValueError as exc:
            if "not found in the base model" not in str(exc):
                raise
            linear = sorted(
                {
                    n.rsplit(".", 1)[-1]
                    for n, m in self.model.named_modules()
                    if isinstance(m, torch.nn.Linear)
                }
            )
            raise ValueError(
                f"adapter {adapter_name!r}: {exc} This model's linear layers are named: "
                f"{', '.join(linear)} (or use target_modules='all-linear')"
            ) from None
        if full is not None:
            # What was set before the first adapter (loss, template, processor, metrics)
            # carries over to it rather than vanishing with the full-model state.
            state.loss, state.template, state.processor = full.loss, full.template, full.processor
            state.metrics, state.eval_metrics = full.metrics, full.eval_metrics
        self._states.pop(FULL_MODEL, None)
        self._states[adapter_name] = state
        self._active = None
        return state

    def _init_seed(self, adapter_name: str) -> int:
        """The seed a new adapter's weights are drawn from: the model's seed and its name."""
        return derived_seed(self.seed, adapter_name, "lora-init")

    def _attach_adapter(self, name: str, config_or_path: PeftConfig | str | os.PathLike) -> None:
        if isinstance(config_or_path, PeftConfig):
            if isinstance(self.model, PeftModel):
                self.model.add_adapter(name, config_or_path)
            else:
                self.model = get_peft_model(self.model, config_or_path, adapter_name=name)
            return
        if not isinstance(config_or_path, str | os.PathLike) or not os.path.isdir(config_or_path):
            raise ValueError(
                f"adapter {name!r}: pass a peft config (e.g. LoraConfig) or the folder of a saved "
                f"adapter; {config_or_path!r} is neither"
            )
        if isinstance(self.model, PeftModel):
            self.model.load_adapter(config_or_path, adapter_name=name, is_trainable=True)
        else:
            self.model = PeftModel.from_pretrained(
                self.model, config_or_path, adapter_name=name, is_trainable=True
            )
        self.model.to(self.device)

    @remote_function(dispatch="all", collect="first", wire=WirePolicy(named=("optimizer_cls",)))
    def set_optimizer(
        self, optimizer_cls: Any = "AdamW", *, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        state = self._state(adapter_name)
        self._parallel()  # NOTE: FSDP2 replaces the parameters: the optimizer must come after
        state.optimizer = build_optimizer(self.model, optimizer_cls, **kwargs)
        state.lr_scheduler = None

    @remote_function(dispatch="all", collect="first", wire=WirePolicy(named=("scheduler_cls",)))
    def set_lr_scheduler(
        self,
        scheduler_cls: Any = "CosineWarmupScheduler",
        *,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        state = self._state(adapter_name)
        if state.optimizer is None:
            raise ValueError("set_lr_scheduler needs an optimizer: call set_optimizer(...) first")
        state.lr_scheduler = build_lr_scheduler(state.optimizer, scheduler_cls, **kwargs)

    # ---- inputs ---------------------------------------------------------------------------

    def _pad_token_id(self) -> int | None:
        return self.model.config.pad_token_id

    def _collate(self, inputs: Any, state: TrainState) -> dict[str, torch.Tensor]:
        """Turn InputFeatures, Trajectories or an already collated batch into device tensors."""
        batch = self._batch_of(inputs, state)
        check_token_ids(batch.get("input_ids"), self._hf_model().get_input_embeddings())
        return {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in batch.items()}

    @staticmethod
    def _micro_batches(
        batch: dict, loss_kwargs: dict, micro_batch_size: int | None
    ) -> list[tuple[dict, dict]]:
        """Split the batch, and the per-row loss arguments (advantages, old_logps, ...) with it."""
        rows = batch["input_ids"].shape[0]
        if micro_batch_size is not None and (
            isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, numbers.Integral)
        ):
            raise ValueError(
                f"micro_batch_size must be an int >= 1 or None, got {micro_batch_size!r}"
            )
        if micro_batch_size is None or micro_batch_size >= rows:
            return [(batch, loss_kwargs)]
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")

        def rows_of(values: dict, i: int) -> dict:
            return {
                k: v[i : i + micro_batch_size]
                if (torch.is_tensor(v) and v.dim() > 0 and v.shape[0] == rows)
                or (isinstance(v, list | tuple) and len(v) == rows)
                else v
                for k, v in values.items()
            }

        starts = range(0, rows, micro_batch_size)
        return [(rows_of(batch, i), rows_of(loss_kwargs, i)) for i in starts]

    # ---- forward and backward -------------------------------------------------------------

    def _hf_model(self) -> PreTrainedModel:
        return self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model

    def _forward(self, batch: dict) -> dict[str, torch.Tensor]:
        """Run the model; with labels, also the label-token logps and predicted ids; for a
        MoE whose config sets ``output_router_logits``, the router ``aux_loss`` too.

        When full logits would be large (``prefers_chunked``) and the head is a plain
        linear layer, only the decoder runs here and the head is applied chunk by
        chunk on the label positions, so full-vocabulary logits never exist.
        """
        base = self._hf_model()
        if not wants_router_aux_loss(base):
            return self._model_outputs(batch, {})[0]
        # transformers' in-forward aux loss would see only this rank's part of a batch the plan
        # splits: record the router logits, have the plan finish them, and compute it here.
        with record_router_logits(base) as router_logits:
            outputs, part, packed = self._model_outputs(batch, {"output_router_logits": False})
        router_logits = self._parallel().finish_router_logits(part, router_logits)
        # A packed forward routed the real tokens alone: no padding to mask.
        mask = None if packed else batch.get("attention_mask")
        outputs["aux_loss"] = router_aux_loss(base, router_logits, mask)
        return outputs

    def _model_outputs(self, batch: dict, extra: dict) -> tuple[dict, Any, bool]:
        """The forward's outputs, the part of the batch this rank ran when the plan
        prepared one (None: the whole batch), and whether its rows ran packed."""
        model_inputs = {k: batch[k] for k in MODEL_INPUT_KEYS if k in batch}
        model_inputs.update(extra)
        labels = batch.get("labels")
        base = self._hf_model()
        if is_packed_batch(batch):
            self._packing.require(base, "the batch is packed (several sequences in one row)")
        plan = self._parallel()
        packed = None
        if self._may_pack(plan.splits_sequences, labels is not None):
            packed = self._packing.pack(base, batch, self._mode())
        if packed is not None:  # padded rows, run as one packed row and scattered back
            model_inputs = {**packed.model_inputs(), **extra}
            labels = packed.labels
        # Packed rows need layers that keep their sequences apart (Qwen3.5's linear attention).
        apply_for_batch(base, model_inputs if packed is not None else batch)
        # A strategy that splits sequences splits the packed row, its sequences marked.
        prepared = plan.prepare_batch(batch if packed is None else packed.varlen_batch())
        if prepared is not None:  # this rank runs a part of the batch; the plan finishes it
            inputs, part = prepared
            with autocast(self.precision, self.device.type):
                logits = self.model(**inputs, **extra, use_cache=False).logits
                outputs = plan.finish_outputs(part, logits)
        else:
            part, outputs = None, self._token_outputs(base, model_inputs, labels)
        if packed is None:
            return outputs, part, False
        return {key: packed.to_rows(value) for key, value in outputs.items()}, part, True

    def _may_pack(self, splits_sequences: bool, labelled: bool) -> bool:
        """Whether a padded batch may run packed. Under a strategy that splits sequences only
        a labelled forward outside routing replay: its logps are gathered and scattered back
        to rows, while unlabelled logits may stay per shard (``gather_logits=False``) and
        recorded routes are per shard of the padded rows."""
        return not splits_sequences or (labelled and not self._routing.engaged)

    def _mode(self) -> bool | None:
        """The active unit's processor's ``padding_free`` (None: the model chooses)."""
        state = self._states.get(self._active or FULL_MODEL)
        processor = None if state is None else state.processor
        if processor is None:
            return None
        return processor.padding_free if isinstance(processor, InputProcessor) else False

    def _token_outputs(
        self, base: PreTrainedModel, model_inputs: dict, labels: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        """The forward on one rank's whole batch: logits without labels, else label logps
        and predicted ids (and the logits, unless the head ran chunk by chunk)."""
        head = base.get_output_embeddings()
        chunked = (
            labels is not None
            and type(head) is torch.nn.Linear
            and not _scales_logits(base.config)
            and prefers_chunked(labels.numel(), head.out_features)
        )
        # The head matmul of the chunked path runs under the same autocast as the model.
        with autocast(self.precision, self.device.type):
            if chunked:
                hidden = base.get_decoder()(**model_inputs, use_cache=False).last_hidden_state
                result = chunked_logps(hidden, head.weight, labels, head.bias)
                outputs = {}
            else:
                logits = self.model(**model_inputs, use_cache=False).logits
                if labels is None:
                    return {"logits": logits.float()}
                result = logps_from_logits(logits, labels)
                outputs = {"logits": logits}
        outputs.update(logps=result.logps, pred_ids=result.predicted_ids)
        return outputs

    def _loss(
        self, batch: dict, outputs: dict, state: TrainState, **loss_kwargs
    ) -> tuple[torch.Tensor, float]:
        result = state.loss(batch, outputs, **loss_kwargs)
        # A loss's extra keys (RL losses' policy_stats) go to the metrics with the outputs.
        outputs.update({k: v for k, v in result.items() if k not in ("loss", "num_tokens")})
        num_tokens = float(result["num_tokens"])
        if num_tokens <= 0:
            raise ValueError(
                "the batch has no label tokens (every label is -100), so there is nothing to "
                "train on; check the template's labels or the data"
            )
        loss = result["loss"]
        if "aux_loss" in outputs:
            # Losses are sums divided by the step's token count: scaled by this batch's
            # tokens, the aux loss becomes coef * aux after that division, so one batch's
            # gradient is transformers' (loss + router_aux_loss_coef * aux_loss); over
            # accumulated batches, the token-weighted mean of their aux losses.
            coef = self._hf_model().config.get_text_config().router_aux_loss_coef
            loss = loss + coef * outputs["aux_loss"] * num_tokens
        return loss, num_tokens

    def _check_task(self, task: str) -> str:
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
        if task == "causal_lm" and self._hf_model().get_output_embeddings() is None:
            raise ValueError(
                f"{type(self._hf_model()).__name__} has no language-model head (it was loaded "
                "with a model_cls such as AutoModel), so it cannot predict tokens; train it "
                "with task='embedding', or load a causal LM"
            )
        return task

    @remote_function(
        dispatch=slice_dp_rows,
        collect="rows",
        wire=WirePolicy(batch="inputs", returns="model_output"),
    )
    def forward_backward(
        self,
        inputs: Any,
        *,
        adapter_name: str | None = None,
        micro_batch_size: int | None = None,
        task: str = "causal_lm",
        routing_replay: bool | None = None,
        **loss_kwargs: Any,
    ) -> ModelOutput:
        """Forward, loss and backward; gradients and the token count accumulate until a step.

        Returns the mean loss over this call's tokens and per-token logps
        (detached, aligned with the labels). ``task='embedding'`` trains an embedding
        model instead (``embedding_model``) and returns the pooled ``embeddings``; it takes
        no ``micro_batch_size``, since a contrastive loss scores each row against the whole
        batch: smaller batches are a different loss, not a split of this one.

        On a Ray group each data-parallel worker runs its share of the rows and the call
        returns the whole batch's output (``collect='rows'``): every row's logps, the loss
        over all the tokens and their count. A worker whose share is empty (fewer rows than
        workers) returns no rows and still joins the gradient reduction, adding zero.
        """
        state = self._state(adapter_name)
        check_loss_keywords(state.loss, loss_kwargs, TransformersModel.forward_backward)
        state.pending_forward = state.pending_loss = None  # this forward is the last one
        self._train_mode()
        if state.window_start is None:
            state.window_start = time.perf_counter()
        if self._parallel().pipeline is not None:
            return pipeline_pass(
                self, state, inputs, task, micro_batch_size, loss_kwargs, train=True
            )
        if self._is_idle_share(inputs, "forward_backward"):
            self._idle_backward(state)
            return ModelOutput(logps=torch.empty(0, 0), num_tokens=0.0)
        if self._check_task(task) == "embedding":
            return self._embedding_forward_backward(inputs, state, micro_batch_size, **loss_kwargs)
        batch = self._collate(inputs, state)
        loss_kwargs = align_loss_inputs(batch, loss_kwargs)
        loss_sum, tokens, logps = 0.0, 0.0, []
        micro_batches = self._micro_batches(batch, loss_kwargs, micro_batch_size)
        replay, start = self._routing.active(routing_replay), 0
        for index, (micro, micro_kwargs) in enumerate(micro_batches):
            final = self._steps_now(state) and index == len(micro_batches) - 1
            rows = slice(start, start + micro["input_ids"].shape[0])
            start = rows.stop
            # Open through the backward: a checkpointed layer's recompute routes again.
            with self._replaying(state, batch, rows, micro, replay):
                outputs = self._run(state, self._forward, micro, final_backward=final)
                loss, num_tokens = self._loss(micro, outputs, state, **micro_kwargs)
                self._backward(state, micro, outputs, loss, num_tokens)
            loss_sum, tokens = loss_sum + float(loss.detach()), tokens + num_tokens
            logps.append(outputs["logps"].detach().cpu())
        return ModelOutput(loss=loss_sum / tokens, logps=_pad_cat(logps), num_tokens=tokens)

    def _replaying(self, state: TrainState, batch: dict, rows: slice, micro: dict, on: bool):
        """The routing replay of ``micro`` (rows ``rows`` of ``batch``), when on."""
        splits = on and self._parallel().splits_sequences
        return self._routing.replay(self._hf_model(), batch, state.name, rows, micro, splits, on)

    def _backward(
        self, state: TrainState, batch: dict, outputs: dict, loss: torch.Tensor, num_tokens: float
    ) -> None:
        """Backward of a summed loss; the normaliser waits in ``pending_tokens`` for the step."""
        loss.backward()
        self._account_backward(state, batch, outputs, loss, num_tokens)

    def _account_backward(
        self, state: TrainState, batch: dict, outputs: dict, loss: torch.Tensor, num_tokens: float
    ) -> None:
        """Count a backward's tokens and metrics in ``state`` (a batched pass of several
        units back-propagates their losses at once, then counts each)."""
        state.pending_tokens += num_tokens
        mask = batch.get("attention_mask")
        real_tokens = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        if self._counts_batch_metrics():
            # A MoE's router loss, for ScalarMetric('aux_loss').
            extra = {"aux_loss": outputs["aux_loss"].detach()} if "aux_loss" in outputs else {}
            state.metrics.accumulate(
                batch,
                outputs,
                loss=loss.detach(),
                num_tokens=num_tokens,
                input_tokens=real_tokens,
                **extra,
            )

    def _counts_batch_metrics(self) -> bool:
        """Whether this rank counts its batch in the metrics (the plan's peers may share one)."""
        return self._parallel().reports_metrics

    # The three-call form of forward_backward, for loops that inspect outputs or the loss
    # before backward: forward(inputs); calculate_loss(**kw); backward().

    @remote_function(dispatch=slice_dp_rows, collect="first")
    def forward(
        self, inputs: Any, *, adapter_name: str | None = None, routing_replay: bool | None = None
    ) -> ModelOutput:
        """Forward with gradients; the outputs wait for ``calculate_loss`` and ``backward``."""
        if self._parallel().pipeline is not None:
            refuse_three_calls("forward")
        state = self._state(adapter_name)
        self._train_mode()
        if state.window_start is None:
            state.window_start = time.perf_counter()
        batch = self._collate(inputs, state)
        replay = self._routing.active(routing_replay)
        if replay and self.gradient_checkpointing:
            raise ValueError(
                "routing replay with gradient checkpointing recomputes the routers in "
                "backward(), after forward() returned: use forward_backward, which replays "
                "through its backward, or pass routing_replay=False"
            )
        rows = slice(0, batch["input_ids"].shape[0])
        with self._replaying(state, batch, rows, batch, replay):
            outputs = self._run(state, self._forward, batch, final_backward=self._steps_now(state))
        state.pending_forward, state.pending_loss = (batch, outputs), None
        if "logps" not in outputs:
            return ModelOutput(logits=outputs["logits"].detach().cpu())
        return ModelOutput(logps=outputs["logps"].detach().cpu())

    @remote_function(dispatch="all", collect="mean")
    def calculate_loss(self, *, adapter_name: str | None = None, **loss_kwargs: Any) -> float:
        """The loss of the last ``forward`` or ``forward_only`` (its mean over the
        normaliser), kept for backward (after ``forward`` only)."""
        if self._parallel().pipeline is not None:
            refuse_three_calls("calculate_loss")
        state = self._state(adapter_name)
        check_loss_keywords(state.loss, loss_kwargs, TransformersModel.calculate_loss)
        if state.pending_forward is None:
            raise ValueError(
                "calculate_loss needs outputs: call forward(inputs) (or forward_only(inputs) "
                "to evaluate) first"
            )
        batch, outputs = state.pending_forward
        loss, num_tokens = self._loss(batch, outputs, state, **loss_kwargs)
        state.pending_loss = (loss, num_tokens)
        return float(loss.detach()) / num_tokens

    @remote_function(dispatch="all", collect="first")
    def backward(self, *, adapter_name: str | None = None) -> None:
        """Backward of the loss from ``calculate_loss``; gradients accumulate until a step."""
        state = self._state(adapter_name)
        if state.pending_loss is None:
            raise ValueError("backward needs a loss: call forward(inputs), then calculate_loss()")
        (batch, outputs), (loss, num_tokens) = state.pending_forward, state.pending_loss
        if not loss.requires_grad:
            raise ValueError(
                "backward after forward_only: forward_only keeps no gradients; to train, call "
                "forward(inputs), then calculate_loss() and backward()"
            )
        self._backward(state, batch, outputs, loss, num_tokens)
        state.pending_forward = state.pending_loss = None

    @remote_function(
        dispatch=slice_dp_rows,
        collect="rows",
        wire=WirePolicy(batch="inputs", returns="model_output"),
    )
    @torch.no_grad()
    def forward_only(
        self,
        inputs: Any,
        *,
        adapter_name: str | None = None,
        task: str = "causal_lm",
        routing_replay: bool | None = None,
        **loss_kwargs: Any,
    ) -> ModelOutput:
        """Forward without gradients; with labels, the loss, fed to the evaluation metrics.
        ``calculate_loss()`` after it returns that loss again (the documents' evaluation loop:
        forward_only, calculate_loss, calculate_metric(is_training=False)), touching neither
        gradients nor the training metrics. ``task='embedding'`` returns the pooled
        ``embeddings`` (and the loss when the batch carries group labels)."""
        state = self._state(adapter_name)
        check_loss_keywords(state.loss, loss_kwargs, TransformersModel.forward_only)
        self.model.eval()
        eval_metrics = state.eval_metrics
        state.pending_forward = state.pending_loss = None
        if self._parallel().pipeline is not None:
            return pipeline_pass(self, state, inputs, task, None, loss_kwargs, train=False)
        if self._is_idle_share(inputs, "forward_only"):
            return ModelOutput(logps=torch.empty(0, 0), num_tokens=0.0)
        if self._check_task(task) == "embedding":
            return self._embedding_forward_only(inputs, state, **loss_kwargs)
        batch = self._collate(inputs, state)
        record = self._routing.active(routing_replay)
        splits = record and self._parallel().splits_sequences
        with self._routing.record(self._hf_model(), batch, state.name, splits, record):
            outputs = self._run(state, self._forward, batch)
        loss = tokens = None
        if "labels" in batch:
            loss_sum, tokens = self._loss(batch, outputs, state, **loss_kwargs)
            loss = float(loss_sum) / tokens
            mask = batch.get("attention_mask")
            real_tokens = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
            if self._counts_batch_metrics():
                eval_metrics.accumulate(
                    batch, outputs, loss=loss_sum, num_tokens=tokens, input_tokens=real_tokens
                )
            # Kept for calculate_loss, without the full-vocabulary logits (the loss reads logps).
            state.pending_forward = (batch, {k: v for k, v in outputs.items() if k != "logits"})
        logps = outputs.get("logps", torch.empty(0)).cpu()
        return ModelOutput(loss=loss, logps=logps, num_tokens=tokens)

    def _is_idle_share(self, inputs: Any, method: str) -> bool:
        """Whether ``inputs`` holds no rows: a data-parallel worker's empty share of a batch
        with fewer rows than workers. A single process given no rows is refused."""
        if isinstance(inputs, Mapping) or hasattr(inputs, "keys"):
            ids = inputs.get("input_ids") if hasattr(inputs, "get") else None
            rows = None if ids is None or not hasattr(ids, "shape") else ids.shape[0]
        else:
            rows = len(inputs) if isinstance(inputs, list | tuple) else None
        if rows != 0:
            return False
        if not self._parallel().distributed:
            raise ValueError(f"{method} got an empty batch; give it at least one sequence")
        return True

    def _idle_backward(self, state: TrainState) -> None:
        """A backward whose gradient is zero, on one pad token: under DDP each synchronised
        backward is a collective that every rank must join, rows or not."""
        pad = torch.full((1, 1), self._pad_token_id() or 0, device=self.device)
        batch = {"input_ids": pad, "attention_mask": torch.ones_like(pad)}
        outputs = self._run(state, self._forward, batch, final_backward=self._steps_now(state))
        (outputs["logits"].sum() * 0).backward()

    # ---- optimizer steps ------------------------------------------------------------------

    def _normalise_gradients(self, state: TrainState) -> None:
        """Divide the summed gradients by the token count of the whole global batch: the one
        normalisation. Each rank back-propagated the SUM of its own tokens' losses; DDP and
        FSDP average the gradients over ``gradient_ranks`` ranks, so the scale is
        ranks / global tokens, which gives the single-process gradient however unevenly the
        tokens fall across ranks. A collective: every rank calls it."""
        plan = self._parallel()
        if plan.distributed and state.name in self._unreduced:
            raise RuntimeError(
                f"the last backward of {state.name!r} did not reduce its gradients over the "
                f"ranks: it expected {state.gradient_accumulation_steps - state.accumulated_calls}"
                f" more clip_grad_and_step calls before the optimizer step. Under torchrun, step "
                f"with clip_grad_and_step and set gradient_accumulation_steps in "
                f"add_adapter_to_model (or before the window's first forward_backward)"
            )
        tokens = plan.global_tokens(state.pending_tokens)
        state.pending_tokens = 0.0
        if tokens <= 0:
            return
        plan.reduce_extra_gradients()
        scale = plan.gradient_ranks / tokens
        for group in state.optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.grad.mul_(scale)

    def _summed_loss_tokens(self) -> float:
        """Each rank's share of a global token count of 1 (``_normalise_gradients`` asks the
        plan for the global count), for ``step_with(normalise=False)``."""
        return self._parallel().tokens_per_rank()

    def _require_optimizer(self, state: TrainState, action: str) -> torch.optim.Optimizer:
        if state.optimizer is None:
            target = "" if state.name == FULL_MODEL else f", adapter_name={state.name!r}"
            raise ValueError(
                f"{action} needs an optimizer: call set_optimizer('AdamW', lr=...{target}) first"
            )
        return state.optimizer

    def _clip(self, state: TrainState, max_norm: float) -> float:
        optimizer = self._require_optimizer(state, "clip_grad_norm")
        self._normalise_gradients(state)
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        state.last_grad_norm = self._parallel().clip_grad_norm(params, max_norm)
        return state.last_grad_norm

    def _step(self, state: TrainState) -> None:
        optimizer = self._require_optimizer(state, "step")
        self._normalise_gradients(state)
        optimizer.step()
        state.step += 1

    def _zero_grad(self, state: TrainState) -> None:
        self._require_optimizer(state, "zero_grad").zero_grad(set_to_none=True)
        state.pending_tokens = 0.0
        self._unreduced.discard(state.name)

    # ---- reporting ------------------------------------------------------------------------

    @remote_function(dispatch="all", collect="first", wire=WirePolicy())
    def calculate_metric(
        self, is_training: bool = True, *, adapter_name: str | None = None
    ) -> dict[str, float]:
        """The training metrics (or, with ``is_training=False``, the evaluation metrics fed
        by forward_only) since the last call, as floats; resets that collection."""
        collection = self._metrics(adapter_name, is_training)
        plan = self._parallel()
        if plan.distributed:
            collection.reduce_across(plan.all_reduce_tensor)
        return collection.calculate_and_reset()

    @remote_function(dispatch="all", collect="first", wire=WirePolicy())
    def get_train_configs(self, *, adapter_name: str | None = None) -> str:
        state = self._state(adapter_name)
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in self.model.parameters())
        name = self.model_id or type(self.model).__name__
        share = 100 * trainable / max(total, 1)
        lines = [
            f"model: {name} on {self.device} ({self.precision})",
            f"parameters: {trainable:,} trainable of {total:,} ({share:.2f}%)",
            f"adapters: {', '.join(self.adapter_names) or 'none (full-parameter training)'}",
            f"optimizer: {type(state.optimizer).__name__ if state.optimizer else 'not set'}",
            f"lr scheduler: {type(state.lr_scheduler).__name__ if state.lr_scheduler else 'none'}",
            f"loss: {type(state.loss).__name__}",
            f"gradient accumulation steps: {state.gradient_accumulation_steps}",
            f"gradient checkpointing: {self.gradient_checkpointing}",
        ]
        return "\n".join(lines)


def _scales_logits(config) -> bool:
    """Whether the model changes its logits after the head (Gemma's soft-capping, Cohere's
    logit_scale, Granite's logits_scaling): the chunked path applies the bare head, so such
    models keep the plain logits path."""
    capping = getattr(config, "final_logit_softcapping", None)
    scale = getattr(config, "logit_scale", 1.0)
    scaling = getattr(config, "logits_scaling", 1.0)
    return bool(capping) or scale not in (None, 1, 1.0) or scaling not in (None, 1, 1.0)


def _pad_cat(rows: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate per-micro-batch (B_i, T_i) tensors along the batch, right-padding with 0."""
    if len(rows) == 1:
        return rows[0]
    width = max(r.shape[-1] for r in rows)
    return torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[-1])) for r in rows])
