"""Token-level cross entropy: the supervised fine-tuning loss."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.loss.base import IGNORE_INDEX, Loss, LossInputs
from twinkle.loss.fields import count_label_tokens, label_mask, outputs_device, token_labels
from twinkle.loss.logps import TokenLogps, token_logps
from twinkle.loss.registry import LOSSES

REDUCTIONS = ("token", "mean", "sum")
# outputs that carry one entry per token: given flat (packed) they gain a batch axis of 1.
_PER_TOKEN_OUTPUTS = {"logps": 1, "logits": 2, "hidden_states": 2}


def cross_entropy_result(
    result: TokenLogps,
    mask: torch.Tensor,
    num_tokens: torch.Tensor,
    *,
    reduction: str = "token",
    dft: bool = False,
) -> dict[str, torch.Tensor]:
    """The loss dict shared by both cross-entropy losses (see CrossEntropyLoss)."""
    per_token = -result.logps
    if dft:
        per_token = per_token * result.logps.detach().exp()
    loss = torch.where(mask, per_token, 0).sum()
    if reduction == "mean":
        loss, num_tokens = loss / num_tokens, torch.ones_like(num_tokens)
    elif reduction == "sum":
        num_tokens = torch.ones_like(num_tokens)
    out = {"loss": loss, "num_tokens": num_tokens, "logps": result.logps.detach()}
    if result.predicted_ids is not None:
        out["predicted_ids"] = result.predicted_ids
    return out


def check_reduction(owner: str, reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(
            f"{owner}: reduction must be one of {', '.join(map(repr, REDUCTIONS))}, got "
            f"{reduction!r}"
        )
    return reduction


@LOSSES.register
class CrossEntropyLoss(Loss):
    """``loss = -sum over label tokens (b, t) of log p(labels[b, t] | tokens < t)``,
    ``num_tokens`` = the number of label tokens (labels != ignore_index, t >= 1).

    That default (``reduction='token'``) is the documented one: the model divides the
    summed loss of a whole step by its tokens once, so micro-batches, accumulation and
    ranks train as one batch. ``reduction='mean'`` divides by this batch's tokens instead
    (``num_tokens`` = 1: each batch of a step weighs the same), ``'sum'`` keeps the sum
    (``num_tokens`` = 1: the gradient of the summed loss). ``dft=True`` weights each
    token's term by its own detached probability (Dynamic Fine-Tuning):
    ``-p.detach() * log p``.

    Reads ``inputs['labels']`` (B, T), or flat (N,) for one packed row, and, from
    ``outputs``, ``logps``, ``logits`` or ``hidden_states`` + ``lm_head_weight`` of the
    matching shape (then computed chunk by chunk; see ``twinkle.loss.logps``). Also returns,
    detached, for metrics: ``logps`` aligned with labels, and ``predicted_ids``, the argmax
    token predicting each position (-100 off the labels), when logits or hidden states were
    given; both in the labels' shape.
    """

    reads = LossInputs()

    def __init__(
        self, ignore_index: int = IGNORE_INDEX, reduction: str = "token", dft: bool = False
    ) -> None:
        self.ignore_index = ignore_index
        self.reduction = check_reduction(type(self).__name__, reduction)
        self.dft = bool(dft)

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = type(self).__name__
        flat = inputs.get("labels") is not None and torch.as_tensor(inputs["labels"]).ndim == 1
        if flat:
            inputs, outputs = _with_batch_axis(inputs, outputs)
        labels = token_labels(inputs, owner, outputs_device(outputs))
        mask = label_mask(labels, self.ignore_index)
        num_tokens = count_label_tokens(mask, owner)
        result = token_logps(outputs, labels, owner=owner, ignore_index=self.ignore_index)
        out = cross_entropy_result(result, mask, num_tokens, reduction=self.reduction, dft=self.dft)
        if flat:
            for key in ("logps", "predicted_ids"):
                if key in out:
                    out[key] = out[key][0]
        return out


def _with_batch_axis(
    inputs: Mapping[str, Any], outputs: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Flat (N,) labels and their (N, ...) outputs as one row of a batch."""
    labels = torch.as_tensor(inputs["labels"])
    reshaped = dict(outputs)
    for key, flat_ndim in _PER_TOKEN_OUTPUTS.items():
        value = outputs.get(key)
        if value is None:
            continue
        if value.ndim != flat_ndim or value.shape[0] != labels.shape[0]:
            raise ValueError(
                f"CrossEntropyLoss: flat labels ({labels.shape[0]},) need outputs[{key!r}] "
                f"with {labels.shape[0]} rows and {flat_ndim} dimension(s), got shape "
                f"{tuple(value.shape)}"
            )
        reshaped[key] = value[None]
    return {**inputs, "labels": labels[None]}, reshaped
