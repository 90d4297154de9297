"""Direct preference optimisation on (chosen, rejected) pairs.

Layout: the batch holds pairs on consecutive rows, chosen first: rows 0, 2, 4, ... are
the chosen responses and rows 1, 3, 5, ... the rejected responses to the same prompts, so
B is even. Each row must have label tokens (the response).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.loss.base import Loss
from twinkle.loss.fields import (
    label_mask,
    outputs_device,
    per_sequence_or_token,
    require,
    token_labels,
)
from twinkle.loss.logps import token_logps
from twinkle.loss.registry import LOSSES

_LOSS_TYPES = ("sigmoid", "ipo", "hinge")
_REF_HINT = (
    "pass ref_logps, the reference model's logps of the same batch: (B, T) aligned with "
    "labels, per-sequence lists of the label tokens' values, or per-sequence sums (B,)"
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
    length-averaged, log-probabilities, like the other two.
    """

    def __init__(
        self, beta: float = 0.1, loss_type: str = "sigmoid", label_smoothing: float = 0.0
    ) -> None:
        if beta <= 0:
            raise ValueError(f"DPOLoss: beta must be positive, got {beta}")
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
        labels = token_labels(inputs, owner, outputs_device(outputs))
        if labels.shape[0] % 2:
            raise ValueError(
                f"{owner} takes (chosen, rejected) pairs on consecutive rows, so an even "
                f"number of rows; got {labels.shape[0]}"
            )
        mask = label_mask(labels)
        empty = (~mask.any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"{owner}: rows {empty} have no label tokens (no response to score)")
        ref = require("ref_logps", inputs, kwargs, owner=owner, hint=_REF_HINT)
        logps = token_logps(outputs, labels, owner=owner).logps
        ref = per_sequence_or_token(ref, labels, name="ref_logps", dtype=logps.dtype)
        if ref.ndim == 2:
            ref = torch.where(mask, ref, 0).sum(dim=1)
        log_ratio = torch.where(mask, logps, 0).sum(dim=1) - ref
        h = log_ratio[0::2] - log_ratio[1::2]
        if self.loss_type == "sigmoid":
            smooth = self.label_smoothing
            per_pair = -(1 - smooth) * F.logsigmoid(self.beta * h)
            per_pair = per_pair - smooth * F.logsigmoid(-self.beta * h)
        elif self.loss_type == "ipo":
            per_pair = (h - 1 / (2 * self.beta)) ** 2
        else:
            per_pair = torch.relu(1 - self.beta * h)
        num_pairs = torch.tensor(h.shape[0], device=h.device)
        return {"loss": per_pair.sum(), "num_tokens": num_pairs}
