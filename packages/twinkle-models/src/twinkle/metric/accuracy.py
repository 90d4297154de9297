"""TokenAccuracyMetric: how often the most likely next token is the label.

Labels are not shifted: ``labels[b, t]`` is the target at position t (-100 outside the loss) and
the logits at position t-1 predict it, so position 0 is never scored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.metric._values import tensor_field
from twinkle.metric.base import METRICS, Metric

IGNORE_INDEX = -100


@METRICS.register
class TokenAccuracyMetric(Metric):
    """``token_accuracy = #(prediction == label) / #(label tokens)`` over the accumulated calls.

    Takes the predictions from ``outputs['pred_ids']`` (B, T) when present: the argmax ids
    already aligned with labels like ``logps`` (``pred_ids[b, t]`` predicts ``labels[b, t]``),
    which a chunked loss can emit without ever holding full logits. Otherwise it takes the
    argmax of ``outputs['logits']`` (B, T, V) at t-1, one pass over the logits with no copy.
    Counts stay on the device until ``calculate``. Ignores calls that carry neither (an
    embedding batch, a step-level call).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._correct: torch.Tensor | int = 0
        self._total: torch.Tensor | int = 0
        self._seen = False

    def accumulate(
        self,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if outputs is None or not ("pred_ids" in outputs or "logits" in outputs):
            return
        labels = tensor_field(inputs or {}, "labels", "inputs", "TokenAccuracyMetric")
        if labels.ndim != 2:
            raise ValueError(f"labels must be (batch, seq), got shape {tuple(labels.shape)}")
        if "pred_ids" in outputs:
            predictions = tensor_field(outputs, "pred_ids", "outputs", "TokenAccuracyMetric")
            if predictions.shape != labels.shape:
                raise ValueError(
                    f"outputs['pred_ids'] has shape {tuple(predictions.shape)} but labels have "
                    f"{tuple(labels.shape)}; pred_ids must be aligned with labels"
                )
            targets = labels
        else:
            logits = tensor_field(outputs, "logits", "outputs", "TokenAccuracyMetric")
            if logits.ndim != 3 or logits.shape[:2] != labels.shape:
                raise ValueError(
                    f"outputs['logits'] must be (batch, seq, vocab) matching labels "
                    f"{tuple(labels.shape)}, got {tuple(logits.shape)}"
                )
            predictions = logits[:, :-1].detach().argmax(dim=-1)
            targets = labels[:, 1:]
        targets = targets.to(predictions.device)
        scored = targets != IGNORE_INDEX
        self._correct = self._correct + ((predictions == targets) & scored).sum()
        self._total = self._total + scored.sum()
        self._seen = True

    def reduce_across(self, reduce_sum) -> None:
        local = torch.tensor([int(self._correct), int(self._total), int(self._seen)])
        correct, total, seen = reduce_sum(local).tolist()
        self._correct, self._total, self._seen = correct, total, seen > 0

    def calculate(self) -> dict[str, float]:
        if not self._seen:
            return {}
        total = int(self._total)
        if total == 0:
            raise ValueError(
                "TokenAccuracyMetric: the accumulated batches hold no scored label tokens "
                "(labels != -100 after position 0), so accuracy is undefined"
            )
        return {"token_accuracy": int(self._correct) / total}
