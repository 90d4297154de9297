"""TransformersModel's forward_backward and forward_only when the model is pipelined.

The batch is cut into equal micro-batches that the schedule runs through the stages; on the
last stage each micro-batch's logits become the label logps and predicted ids exactly as
one process computes them (``logps_from_logits``), the unit's loss scores them (a sum over
the tokens) and the rank that reports the batch counts its tokens and metrics, which the
step's normalisation and ``calculate_metric`` then total over the ranks as for any strategy.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle.data_format import ModelOutput
from twinkle.loss import logps_from_logits
from twinkle.model.loss_inputs import align_loss_inputs
from twinkle.model.precision import autocast
from twinkle.model.train_state import TrainState


def pipeline_pass(
    model: Any,
    state: TrainState,
    inputs: Any,
    task: str,
    micro_batch_size: int | None,
    loss_kwargs: dict[str, Any],
    *,
    train: bool,
) -> ModelOutput:
    """One ``forward_backward`` (``train``) or ``forward_only`` of ``model`` (a
    TransformersModel) under pipeline parallel; the outputs are the last stage's, the loss
    and token count reach every stage."""
    if task != "causal_lm":
        raise ValueError(
            f"task={task!r} does not run under pipeline parallel (pp_size > 1): only "
            "task='causal_lm' does; train embedding models without pp_size"
        )
    plan = model._parallel()
    pipeline = plan.pipeline
    batch = model._collate(inputs, state)
    rows = batch["input_ids"].shape[0]
    if rows == 0:
        raise ValueError(
            "a data rank got no rows under pipeline parallel: give every data rank at least "
            "one row (a batch of at least dp × fsdp rows)"
        )
    loss_kwargs = align_loss_inputs(batch, loss_kwargs)
    count = pipeline.micro_batch_count(rows, micro_batch_size)
    micro = model._micro_batches(batch, loss_kwargs, rows // count)
    scored: list[tuple[float, float, torch.Tensor] | None] = [None] * count
    logits_only: list[torch.Tensor | None] = [None] * count

    def score(index: int, logits: torch.Tensor) -> torch.Tensor:
        micro_batch, micro_kwargs = micro[index]
        labels = micro_batch.get("labels")
        if labels is None:  # forward_only without labels: the logits are the output
            logits_only[index] = logits.detach().float().cpu()
            return logits.float().sum() * 0
        result = logps_from_logits(logits, labels)
        outputs = {"logits": logits, "logps": result.logps, "pred_ids": result.predicted_ids}
        loss, tokens = model._loss(micro_batch, outputs, state, **micro_kwargs)
        if plan.reports_metrics:  # tp peers of the last stage score it too: one counts
            if train:
                model._account_backward(state, micro_batch, outputs, loss, tokens)
            else:
                _count_evaluation(state, micro_batch, outputs, loss, tokens)
        scored[index] = (float(loss.detach()), tokens, outputs["logps"].detach().cpu())
        return loss

    with autocast(model.precision, model.device.type):
        pipeline.run([m for m, _ in micro], score, train=train)
    if any(item is not None for item in logits_only):
        return ModelOutput(logits=torch.cat(logits_only))
    if "labels" not in batch:
        return ModelOutput(logits=torch.empty(0))
    have = [item for item in scored if item is not None]
    loss_sum = sum(item[0] for item in have)
    tokens = sum(item[1] for item in have)
    loss_sum, tokens = pipeline.broadcast_result(loss_sum, tokens)
    # Micro-batches share one shape under pp: their logps join without padding.
    logps = torch.cat([item[2] for item in have]) if have else torch.empty(0, 0)
    return ModelOutput(loss=loss_sum / tokens, logps=logps, num_tokens=tokens)


def _count_evaluation(
    state: TrainState, batch: dict, outputs: dict, loss: torch.Tensor, tokens: float
) -> None:
    mask = batch.get("attention_mask")
    real = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
    state.eval_metrics.accumulate(
        batch, outputs, loss=loss.detach(), num_tokens=tokens, input_tokens=real
    )


def refuse_three_calls(method: str) -> None:
    """The three-call form keeps one forward's outputs for a later backward; a pipeline
    schedule runs forward and backward of its micro-batches together."""
    raise ValueError(
        f"{method} does not run under pipeline parallel (pp_size > 1): the schedule runs the "
        "forward and backward of every micro-batch in one call; use forward_backward to train "
        "and the loss forward_only returns to evaluate"
    )
