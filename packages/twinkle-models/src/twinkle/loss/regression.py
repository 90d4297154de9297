"""Squared error for regression heads (reward models, scorers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.loss.base import Loss, LossInputs
from twinkle.loss.fields import compute_dtype, require
from twinkle.loss.registry import LOSSES


@LOSSES.register
class MSELoss(Loss):
    """``loss = sum over elements of (predictions - targets) ** 2``, ``num_tokens`` = the
    number of predicted values.

    Reads ``outputs['predictions']`` and ``targets`` (keyword or ``inputs['targets']``) of
    the same shape; a (B, 1) head against (B,) targets is an error, not a broadcast.
    """

    reads = LossInputs(required=("targets",))

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = type(self).__name__
        predictions = outputs.get("predictions")
        if predictions is None:
            raise ValueError(f"{owner} needs outputs['predictions'], the regression head's output")
        targets = require(
            "targets", inputs, kwargs, owner=owner, hint="pass targets shaped like predictions"
        )
        predictions = predictions.to(compute_dtype(predictions))
        targets = torch.as_tensor(targets, dtype=predictions.dtype, device=predictions.device)
        if targets.shape != predictions.shape:
            raise ValueError(
                f"{owner}: predictions have shape {tuple(predictions.shape)} but targets "
                f"{tuple(targets.shape)}; reshape one to match"
            )
        if predictions.numel() == 0:
            raise ValueError(f"{owner}: the batch is empty")
        loss = (predictions - targets).pow(2).sum()
        return {"loss": loss, "num_tokens": torch.tensor(predictions.numel(), device=loss.device)}
