"""Several tenants' forward_backward calls as one forward and one backward (and their
forward_only calls as one forward).

``MultiLoraTransformersModel.forward_backward_many`` and ``forward_only_many`` are the
entries; this module is their mechanics. Each tenant's inputs are collated by its own
template and processor and laid out as its forward alone would run them: padded rows, or
(padding-free by default, where the model packs) one packed row. Tenants of one layout are
joined into one batch (padded rows stacked and right-padded to the widest; packed rows
concatenated) and run once through the decoder, each tenant's tokens through its own
adapter (``lora_rows``). Each tenant's tokens are then cut back out, scored by the head and
by its own loss, and the tenants' summed losses are back-propagated together: sequences
never mix in a causal LM, so each adapter's gradient is the one its forward_backward alone
gives (up to the rounding of larger matmuls), and each tenant's normaliser, metrics and
accumulation counters are its own. An evaluation pass (``training=False``) runs the same
forward in eval mode without gradients, and each tenant's loss feeds its evaluation
metrics and its ``calculate_loss``, as ``forward_only`` alone does.

A tenant whose request is refused (its token ids, its loss inputs, a batch with no label
tokens) gets its error and no gradient; the others' results are as if it had not come.
What cannot share a pass runs alone, in order, as ``forward_backward`` (or
``forward_only``): a model under a parallel plan, compiled, with gradient checkpointing or
dropout of its own (training only), a router auxiliary loss, a head that rescales logits, a
batch packed by its processor, an adapter that is not plain LoRA on linear layers, or a call
with other keywords than the loss's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.data_format import ModelOutput
from twinkle.loss import chunked_logps, logps_from_logits, prefers_chunked
from twinkle.model.loss_inputs import align_loss_inputs
from twinkle.model.loss_keywords import check_loss_keywords
from twinkle.model.precision import autocast
from twinkle.model.transformers.lora_rows import RowRouter, Segment
from twinkle.model.transformers.model import TransformersModel, _scales_logits
from twinkle.model.transformers.router_aux_loss import wants_router_aux_loss
from twinkle.patch import apply_for_batch, is_packed_batch
from twinkle.processor import InputProcessor, PackedRows

# forward_backward keywords that change how a call runs rather than what its loss reads.
SOLO_KEYWORDS = ("micro_batch_size", "task", "routing_replay")
Outcome = ModelOutput | Exception


@dataclass
class TenantRequest:
    """One ``forward_backward(inputs, adapter_name=..., **loss_kwargs)`` call."""

    adapter_name: str
    inputs: Any
    loss_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Part:
    """A tenant's request made ready: its batch, loss inputs, and its forward's layout."""

    index: int
    request: TenantRequest
    state: Any
    batch: dict
    loss_kwargs: dict
    packed: PackedRows | None
    segment: Segment | None = None


class _RunsAlone(Exception):
    """A request that is fine but cannot share a pass (see ``solo_reason``)."""


def forward_backward_many(
    model: Any, requests: Sequence[TenantRequest], training: bool = True
) -> list[Outcome]:
    """Each request's ModelOutput, or the exception that refused it, in order: of
    ``forward_backward`` (``training``) or of ``forward_only``. An adapter named twice runs
    its calls in successive passes, in order (its dropout stream and its accumulated
    gradients see them one after the other, as alone)."""
    outcomes: dict[int, Outcome] = {}
    pending = list(enumerate(requests))
    while pending:
        seen: set[str] = set()
        this_pass, later = [], []
        for index, request in pending:
            (later if request.adapter_name in seen else this_pass).append((index, request))
            seen.add(request.adapter_name)
        outcomes.update(_one_pass(model, this_pass, training))
        pending = later
    return [outcomes[i] for i in range(len(requests))]


def _one_pass(
    model: Any, requests: list[tuple[int, TenantRequest]], training: bool
) -> dict[int, Outcome]:
    """The outcomes of requests of distinct adapters, by index."""
    outcomes: dict[int, Outcome] = {}
    layouts: dict[bool, list[_Part]] = {False: [], True: []}
    for index, request in requests:
        try:
            part = _prepare(model, index, request, training)
            layouts[part.packed is not None].append(part)
        except _RunsAlone:
            outcomes[index] = _alone(model, request, training)
        except Exception as exc:  # noqa: BLE001 - this tenant's refusal, handed back
            outcomes[index] = exc
    for parts in layouts.values():
        if len(parts) == 1:
            outcomes[parts[0].index] = _alone(model, parts[0].request, training)
        elif parts:
            shared = _run_shared(model, parts) if training else _evaluate_shared(model, parts)
            outcomes.update(zip((p.index for p in parts), shared, strict=True))
    return outcomes


def _alone(model: Any, request: TenantRequest, training: bool) -> Outcome:
    run = model.forward_backward if training else model.forward_only
    try:
        return run(request.inputs, adapter_name=request.adapter_name, **request.loss_kwargs)
    except Exception as exc:  # noqa: BLE001 - this tenant's refusal, handed back
        return exc


def solo_reason(model: Any, request: TenantRequest, training: bool = True) -> str | None:
    """Why ``request`` cannot share a pass (None when it can); an evaluation pass draws no
    dropout and keeps no graph, so only what changes its forward matters there."""
    if request.adapter_name not in model.adapter_names:
        return "an unknown adapter (forward_backward alone names the error)"
    if any(key in request.loss_kwargs for key in SOLO_KEYWORDS):
        return f"it passes one of {SOLO_KEYWORDS}"
    if model._parallel().distributed:
        return "the model runs under a parallel plan"
    if training and model.gradient_checkpointing:
        return "gradient checkpointing recomputes forwards during backward"
    if model._compiled is not None:
        return "compiled layers would not see the per-row LoRA layers"
    base = model._hf_model()
    if wants_router_aux_loss(base):
        return "the router's auxiliary loss spans the whole batch"
    if _scales_logits(base.config):
        return "the model rescales its logits after the head"
    if training and model.base_dropout:
        return "the base model draws dropout of its own"
    return model._row_reasons.get(request.adapter_name)


def _processor_mode(state: Any) -> bool | None:
    """The tenant's processor's ``padding_free`` (None: the model chooses), as alone."""
    if state.processor is None:
        return None
    return state.processor.padding_free if isinstance(state.processor, InputProcessor) else False


def _prepare(model: Any, index: int, request: TenantRequest, training: bool) -> _Part:
    """The tenant's collated batch, aligned loss inputs and layout; raises what it refuses."""
    if solo_reason(model, request, training) is not None:
        raise _RunsAlone
    state = model._states[request.adapter_name]
    call = TransformersModel.forward_backward if training else TransformersModel.forward_only
    check_loss_keywords(state.loss, request.loss_kwargs, call)
    batch = model._collate(request.inputs, state)
    if is_packed_batch(batch):
        raise _RunsAlone  # packed by its processor: its own positions and sequence offsets
    if "labels" not in batch:
        raise _RunsAlone  # forward_backward alone says what is missing
    loss_kwargs = align_loss_inputs(batch, request.loss_kwargs)
    packed = model._packing.pack(model._hf_model(), batch, _processor_mode(state))
    return _Part(index, request, state, batch, loss_kwargs, packed)


def _joined(parts: list[_Part], pad_id: int) -> tuple[dict[str, torch.Tensor], int]:
    """The tenants' forward inputs as one batch, and the axis their segments tile; each
    part gets its segment."""
    if parts[0].packed is not None:
        for part in parts:
            part.segment = Segment(
                part.request.adapter_name, part.packed.num_tokens, None, part.state.random_stream
            )
        joined = {
            key: torch.cat([p.packed.model_inputs()[key] for p in parts], dim=1)
            for key in ("input_ids", "position_ids")
        }
        return joined, 1
    width = max(p.batch["input_ids"].shape[1] for p in parts)
    ids, masks, positions = [], [], []
    for part in parts:
        batch = part.batch
        rows, own = batch["input_ids"].shape
        mask = batch.get("attention_mask")
        mask = torch.ones_like(batch["input_ids"]) if mask is None else mask
        pos = batch.get("position_ids")
        pos = torch.arange(own, device=mask.device).expand(rows, own) if pos is None else pos
        pad = width - own
        ids.append(F.pad(batch["input_ids"], (0, pad), value=pad_id))
        masks.append(F.pad(mask, (0, pad), value=0))
        positions.append(F.pad(pos, (0, pad), value=0))
        part.segment = Segment(part.request.adapter_name, rows, own, part.state.random_stream)
    joined = {
        "input_ids": torch.cat(ids),
        "attention_mask": torch.cat(masks),
        "position_ids": torch.cat(positions),
    }
    return joined, 0


def _run_shared(model: Any, parts: list[_Part]) -> list[Outcome]:
    """One forward of every part's tokens, each tenant's loss, one backward of their sum."""
    model._train_mode()
    for part in parts:
        part.state.pending_forward = part.state.pending_loss = None
        if part.state.window_start is None:
            part.state.window_start = time.perf_counter()
    with _shared_forward(model, parts) as (scored, refused):
        if scored:
            torch.stack([loss for loss, _, _ in scored.values()]).sum().backward()

    def finish(part: _Part, loss: torch.Tensor, tokens: float, outputs: dict) -> ModelOutput:
        model._account_backward(part.state, part.batch, outputs, loss, tokens)
        logps = outputs["logps"].detach().cpu()
        return ModelOutput(loss=float(loss.detach()) / tokens, logps=logps, num_tokens=tokens)

    return _answers(parts, scored, refused, finish)


@torch.no_grad()
def _evaluate_shared(model: Any, parts: list[_Part]) -> list[Outcome]:
    """One forward of every part's tokens in eval mode, each tenant's loss counted in its
    evaluation metrics and kept for its ``calculate_loss``, as ``forward_only`` alone."""
    model.model.eval()
    for part in parts:
        part.state.pending_forward = part.state.pending_loss = None
    with _shared_forward(model, parts) as (scored, refused):
        pass

    def finish(part: _Part, loss: torch.Tensor, tokens: float, outputs: dict) -> ModelOutput:
        if model._counts_batch_metrics():
            mask = part.batch.get("attention_mask")
            real = int(mask.sum()) if mask is not None else part.batch["input_ids"].numel()
            part.state.eval_metrics.accumulate(
                part.batch, outputs, loss=loss, num_tokens=tokens, input_tokens=real
            )
        kept = {key: value for key, value in outputs.items() if key != "logits"}
        part.state.pending_forward = (part.batch, kept)
        logps = outputs["logps"].cpu()
        return ModelOutput(loss=float(loss) / tokens, logps=logps, num_tokens=tokens)

    return _answers(parts, scored, refused, finish)


def _answers(parts: list[_Part], scored: dict, refused: dict, finish: Any) -> list[Outcome]:
    """Each part's refusal, or ``finish(part, loss, tokens, outputs)`` of its scored loss."""
    return [
        refused[i] if i in refused else finish(part, *scored[i]) for i, part in enumerate(parts)
    ]


@contextlib.contextmanager
def _shared_forward(
    model: Any, parts: list[_Part]
) -> Iterator[tuple[dict[int, tuple[torch.Tensor, float, dict]], dict[int, Exception]]]:
    """The joined forward, each part's (loss, tokens, outputs) by position or the error that
    refused it; the layers stay routed while the caller back-propagates."""
    joined, axis = _joined(parts, model._pad_token_id() or 0)
    base = model._hf_model()
    apply_for_batch(base, joined)
    router = RowRouter(model.model)
    scored: dict[int, tuple[torch.Tensor, float, dict]] = {}
    refused: dict[int, Exception] = {}
    with router.routing([p.request.adapter_name for p in parts]):
        router.segments, router.axis = [p.segment for p in parts], axis
        with autocast(model.precision, model.device.type):
            hidden = base.get_decoder()(**joined, use_cache=False).last_hidden_state
        hidden_by_part = router.split(hidden)
        for i, part in enumerate(parts):
            try:
                outputs = _tenant_outputs(model, router, part, hidden_by_part[i])
                loss, tokens = model._loss(part.batch, outputs, part.state, **part.loss_kwargs)
                scored[i] = (loss, tokens, outputs)
            except Exception as exc:  # noqa: BLE001 - this tenant's refusal, handed back
                refused[i] = exc
        yield scored, refused


def _tenant_outputs(model: Any, router: RowRouter, part: _Part, own: torch.Tensor) -> dict:
    """The tenant's label logps (and logits when they are small) from its tokens' hidden
    states ``own``, by the head as ``forward_backward`` applies it alone, back on its rows."""
    labels = part.batch["labels"] if part.packed is None else part.packed.labels
    head = model._hf_model().get_output_embeddings()
    # A head with LoRA factors sees this tenant's tokens alone.
    router.segments = [Segment(part.segment.adapter, own.shape[0], None, part.segment.stream)]
    router.axis = 0
    with autocast(model.precision, model.device.type):
        if type(head) is torch.nn.Linear and prefers_chunked(labels.numel(), head.out_features):
            result = chunked_logps(own, head.weight, labels, head.bias)
            outputs = {}
        else:
            logits = head(own)
            result = logps_from_logits(logits, labels)
            outputs = {"logits": logits}
    outputs.update(logps=result.logps, pred_ids=result.predicted_ids)
    if part.packed is None:
        return outputs
    return {key: part.packed.to_rows(value) for key, value in outputs.items()}
