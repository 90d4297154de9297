"""Cross entropy straight from hidden states, without full-vocabulary logits.

The model passes ``outputs['hidden_states']`` (B, T, H) and ``outputs['lm_head_weight']``
(V, H) (and ``lm_head_bias`` (V,) if the head has one) instead of logits. Logits exist
for at most ``chunk_size`` label tokens at a time, in forward and backward; positions
outside the labels get no logits at all. ``twinkle.loss.prefers_chunked`` says when this
is worth its extra head matmul.

It is for loops that hold hidden states themselves. ``TransformersModel`` already applies its
head chunk by chunk when the logits would be large and hands losses the label-token logps, so
with a model use ``CrossEntropyLoss``: the memory saving is the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.loss.base import IGNORE_INDEX, Loss, LossInputs
from twinkle.loss.cross_entropy import cross_entropy_result
from twinkle.loss.fields import count_label_tokens, label_mask, outputs_device, token_labels
from twinkle.loss.logps import chunked_logps
from twinkle.loss.registry import LOSSES


@LOSSES.register
class ChunkedCrossEntropyLoss(Loss):
    """The same loss and outputs as ``CrossEntropyLoss``
    (``-sum of log p(label)`` over label tokens, ``num_tokens`` = their count), computed
    from hidden states with ``chunk_size`` tokens of logits at a time (default: 256 MiB of
    float32 logits per chunk, ``twinkle.loss.default_chunk_size``)."""

    reads = LossInputs()

    def __init__(self, chunk_size: int | None = None, ignore_index: int = IGNORE_INDEX) -> None:
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"chunk_size must be a positive number of tokens, got {chunk_size!r}")
        self.chunk_size = chunk_size
        self.ignore_index = ignore_index

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = type(self).__name__
        if outputs.get("hidden_states") is None or outputs.get("lm_head_weight") is None:
            raise ValueError(
                f"{owner} needs outputs['hidden_states'] (B, T, H) and "
                f"outputs['lm_head_weight'] (V, H); for logits or logps use CrossEntropyLoss "
                "(a TransformersModel already chunks its head when the logits would be large)"
            )
        labels = token_labels(inputs, owner, outputs_device(outputs))
        mask = label_mask(labels, self.ignore_index)
        num_tokens = count_label_tokens(mask, owner)
        result = chunked_logps(
            outputs["hidden_states"],
            outputs["lm_head_weight"],
            labels,
            outputs.get("lm_head_bias"),
            self.chunk_size,
            self.ignore_index,
        )
        return cross_entropy_result(result, mask, num_tokens)
