"""One pass of Megatron's pipeline schedule, with twinkle's Loss on the last stage.

Megatron's ``forward_backward_func`` runs the micro-batches through the stages
(no pipelining, 1F1B, or interleaved with virtual stages) and calls the loss
function on the last stage. With ``calculate_per_token_loss`` the schedule
backpropagates the loss as returned, a sum, and leaves the division by the token
count to the optimizer step. The last stage's results (summed loss, tokens, logps,
metrics) are then broadcast over the pipeline group, so every rank returns them.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from twinkle.model.megatron.config import GPTSpec
from twinkle.model.megatron.context_parallel import (
    context_parallel_logps,
    cp_size,
    split_sequence,
)
from twinkle.model.megatron.logps import vocab_parallel_logps
from twinkle.model.train_state import TrainState


def from_last_stage(value: Any) -> Any:
    """``value`` as the last pipeline stage of this rank's pipeline group holds it."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if parallel_state.get_pipeline_model_parallel_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(
        box,
        src=parallel_state.get_pipeline_model_parallel_last_rank(),
        group=parallel_state.get_pipeline_model_parallel_group(),
    )
    return box[0]


def _stage_loss(
    batch: dict,
    loss_kwargs: dict,
    logits: torch.Tensor,
    *,
    spec: GPTSpec,
    state: TrainState,
    forward_only: bool,
    results: list,
    score_only: bool = False,
):
    """Megatron's loss_func: (summed loss, token count, report) for one micro-batch; with
    ``score_only`` the logps alone (no loss, no metrics: ``policy_logps``)."""
    labels = batch.get("labels")
    if labels is None or score_only:
        logps = None
        if labels is not None:
            logps = _logps(logits, labels, spec)[0].detach().float().cpu()
        results.append((0.0, 0.0, logps))
        zero = logits.sum() * 0.0
        return zero, torch.zeros([], dtype=torch.int, device=logits.device), {}
    logps, predicted = _logps(logits, labels, spec)
    outputs = {"logps": logps, "pred_ids": predicted}
    result = state.loss(batch, outputs, **loss_kwargs)
    outputs.update({k: v for k, v in result.items() if k not in ("loss", "num_tokens")})
    loss, tokens = result["loss"], float(result["num_tokens"])
    mask = batch.get("attention_mask")
    real_tokens = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
    metrics = state.eval_metrics if forward_only else state.metrics
    metrics.accumulate(
        batch, outputs, loss=loss.detach(), num_tokens=tokens, input_tokens=real_tokens
    )
    results.append((float(loss.detach()), tokens, outputs["logps"].detach().float().cpu()))
    count = torch.tensor(int(tokens), dtype=torch.int, device=logits.device)
    return loss, count, {}


def _logps(logits: torch.Tensor, labels: torch.Tensor, spec: GPTSpec):
    """(label logps, predicted ids), over the context- or tensor-parallel slices."""
    if cp_size() > 1:
        return context_parallel_logps(logits, labels, spec.vocab_size)
    return vocab_parallel_logps(logits, labels, spec.vocab_size)


def _forward_step(data_iterator, model, **loss_args):
    batch, loss_kwargs = next(data_iterator)
    input_ids = batch["input_ids"]
    if cp_size() > 1:
        input_ids = split_sequence(input_ids)  # the loss still sees the whole batch
    logits = model(input_ids, None, None)
    return logits, functools.partial(_stage_loss, batch, loss_kwargs, **loss_args)


def run_schedule(
    chunks: list,
    micro: list[tuple[dict, dict]],
    spec: GPTSpec,
    state: TrainState,
    forward_only: bool,
    score_only: bool = False,
) -> tuple[float, float, torch.Tensor]:
    """Run every micro-batch through the pipeline; (summed loss, tokens, logps (B, T)).
    ``score_only`` (forward only): the logps, without the loss or metrics."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    results: list = []
    step = functools.partial(
        _forward_step,
        spec=spec,
        state=state,
        forward_only=forward_only or score_only,
        results=results,
        score_only=score_only,
    )
    rows, seq_length = micro[0][0]["input_ids"].shape
    get_forward_backward_func()(
        forward_step_func=step,
        data_iterator=[iter(micro) for _ in chunks],
        model=chunks,
        num_microbatches=len(micro),
        seq_length=seq_length,
        micro_batch_size=rows,
        forward_only=forward_only or score_only,
    )
    summary = None
    if results:
        logps = [r[2] for r in results if r[2] is not None]
        summary = (
            sum(r[0] for r in results),
            sum(r[1] for r in results),
            torch.cat(logps) if logps else torch.empty(0),
        )
    return from_last_stage(summary)
