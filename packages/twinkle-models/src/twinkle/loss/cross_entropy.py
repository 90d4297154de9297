"""Token-level cross entropy: the supervised fine-tuning loss."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.loss.base import IGNORE_INDEX, Loss
from twinkle.loss.fields import count_label_tokens, label_mask, outputs_device, token_labels
from twinkle.loss.logps import TokenLogps, token_logps
from twinkle.loss.registry import LOSSES


def cross_entropy_result(
    result: TokenLogps, mask: torch.Tensor, num_tokens: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The loss dict shared by both cross-entropy losses."""
    out = {
        "loss": -torch.where(mask, result.logps, 0).sum(),
        "num_tokens": num_tokens,
        "logps": result.logps.detach(),
    }
    if result.predicted_ids is not None:
        out["predicted_ids"] = result.predicted_ids
    return out


@LOSSES.register
class CrossEntropyLoss(Loss):
    """``loss = -sum over label tokens (b, t) of log p(labels[b, t] | tokens < t)``,
    ``num_tokens`` = the number of label tokens (labels != ignore_index, t >= 1).

    Reads ``inputs['labels']`` and, from ``outputs``, ``logps`` (B, T), ``logits``
    (B, T, V), or ``hidden_states`` + ``lm_head_weight`` (then computed chunk by chunk;
    see ``twinkle.loss.logps``). Also returns, detached, for metrics: ``logps`` (B, T)
    aligned with labels, and ``predicted_ids`` (B, T), the argmax token predicting each
    position (-100 off the labels), when logits or hidden states were given.
    """

    def __init__(self, ignore_index: int = IGNORE_INDEX) -> None:
        self.ignore_index = ignore_index

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = type(self).__name__
        labels = token_labels(inputs, owner, outputs_device(outputs))
        mask = label_mask(labels, self.ignore_index)
        num_tokens = count_label_tokens(mask, owner)
        result = token_logps(outputs, labels, owner=owner, ignore_index=self.ignore_index)
        return cross_entropy_result(result, mask, num_tokens)
