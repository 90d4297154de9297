"""Direct preference optimisation on (chosen, rejected) pairs (layout: ``twinkle.loss.pairs``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.loss.base import Loss, LossInputs
from twinkle.loss.fields import per_sequence_or_token, require
from twinkle.loss.pairs import preference_stats, read_pairs
from twinkle.loss.registry import LOSSES

_LOSS_TYPES = ("sigmoid", "ipo", "hinge")
_REF_HINT = (
    "pass ref_logps, the reference model's logps of the same batch: (B, T) aligned with "
    "labels, per-sequence lists of the label tokens' values, or per-sequence sums (B,); "
    "for a LoRA policy model.reference_logps(inputs) gives them (the adapter disabled)"
)


@LOSSES.register
class DPOLoss(Loss):
    """DPO, normalised by pairs.

    With sequence log-probabilities ``pi = sum of logps over the row's label tokens`` and
    ``ref`` likewise for the reference model, for each pair (c = chosen, r = rejected)::

        h = (pi_c - ref_c) - (pi_r - ref_r)
        sigmoid: l = -(1 - label_smoothing) * log sigmoid(beta * h)
                     - label_smoothing * log sigmoid(-beta * h)
        ipo:     l = (h - 1 / (2 * beta)) ** 2
        hinge:   l = max(0, 1 - beta * h)

    ``loss = sum over pairs of l``, ``num_tokens`` = the number of pairs (B / 2).
    ``ref_logps`` come as keywords or in inputs; ``label_smoothing`` (the assumed rate of
    flipped preferences) applies to the sigmoid loss only. IPO here uses summed, not
    length-averaged, log-probabilities, like the other two. ``preference_stats`` holds the
    implicit rewards ``beta * (pi - ref)`` for DPOMetric.
    """

    reads = LossInputs(required=("ref_logps",))

    def __init__(
        self, beta: float = 0.1, loss_type: str = "sigmoid", label_smoothing: float = 0.0
    ) -> None:
        if not 0 < beta < float("inf"):
            raise ValueError(f"DPOLoss: beta must be a positive finite number, got {beta}")
        if loss_type not in _LOSS_TYPES:
            raise ValueError(f"DPOLoss: unknown loss_type {loss_type!r}; known: {_LOSS_TYPES}")
        if not 0 <= label_smoothing < 0.5:
            raise ValueError(
                f"DPOLoss: label_smoothing must lie in [0, 0.5), got {label_smoothing}"
            )
        if label_smoothing and loss_type != "sigmoid":
            raise ValueError("DPOLoss: label_smoothing applies to loss_type='sigmoid' only")
        self.beta = beta
        self.loss_type = loss_type
        self.label_smoothing = label_smoothing

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = type(self).__name__
        pairs = read_pairs(owner, inputs, outputs)
        ref = require("ref_logps", inputs, kwargs, owner=owner, hint=_REF_HINT)
        ref = per_sequence_or_token(ref, pairs.labels, name="ref_logps", dtype=pairs.sums.dtype)
        if ref.ndim == 2:
            ref = torch.where(pairs.mask, ref, 0).sum(dim=1)
        chosen, rejected = pairs.chosen_rejected(pairs.sums - ref)
        h = chosen - rejected
        if self.loss_type == "sigmoid":
            smooth = self.label_smoothing
            per_pair = -(1 - smooth) * F.logsigmoid(self.beta * h)
            per_pair = per_pair - smooth * F.logsigmoid(-self.beta * h)
        elif self.loss_type == "ipo":
            per_pair = (h - 1 / (2 * self.beta)) ** 2
        else:
            per_pair = torch.relu(1 - self.beta * h)
        stats = preference_stats(self.beta * chosen, self.beta * rejected)
        return {"loss": per_pair.sum(), "num_tokens": pairs.num_pairs, "preference_stats": stats}
