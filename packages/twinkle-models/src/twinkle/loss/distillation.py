"""Knowledge distillation of a student from a teacher's token distributions: GKD.

On-policy distillation (the student samples, the teacher scores those tokens, the
per-token reverse KL is the advantage) needs no loss of its own: see
``twinkle.advantage.ReverseKLAdvantage`` and train with a policy loss.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from twinkle.loss.base import IGNORE_INDEX, Loss, LossInputs
from twinkle.loss.fields import (
    count_label_tokens,
    label_mask,
    outputs_device,
    require,
    token_labels,
)
from twinkle.loss.registry import LOSSES

_TEACHER_HINT = (
    "pass teacher_logits (B, T, V), the teacher's logits of the same batch (position t - 1 "
    "predicting label t, as the student's): teacher.token_logits(inputs) for a "
    "TransformersModel teacher in this process or on its own Ray device group"
)


def _student_logits(
    outputs: Mapping[str, Any], rows: torch.Tensor, cols: torch.Tensor, owner: str
) -> torch.Tensor:
    """The student's logits predicting each label token, (N, V)."""
    if outputs.get("logits") is not None:
        return outputs["logits"][rows, cols - 1]
    if outputs.get("hidden_states") is not None and outputs.get("lm_head_weight") is not None:
        hidden = outputs["hidden_states"][rows, cols - 1]
        logits = hidden @ outputs["lm_head_weight"].T
        bias = outputs.get("lm_head_bias")
        return logits if bias is None else logits + bias
    raise ValueError(
        f"{owner} compares whole token distributions, so it needs outputs['logits'] (B, T, V) "
        f"or outputs['hidden_states'] with outputs['lm_head_weight'], not logps alone; got "
        f"keys {sorted(k for k, v in outputs.items() if v is not None)}"
    )


def generalized_jsd(
    student_logps: torch.Tensor, teacher_logps: torch.Tensor, beta: float
) -> torch.Tensor:
    """Per-row generalised JSD of (N, V) log-distributions (see GKDLoss)."""
    p_s, p_t = student_logps.exp(), teacher_logps.exp()
    if beta == 0:
        return (p_t * (teacher_logps - student_logps)).sum(-1)
    if beta == 1:
        return (p_s * (student_logps - teacher_logps)).sum(-1)
    mixture = torch.logsumexp(
        torch.stack([teacher_logps + math.log(beta), student_logps + math.log(1 - beta)]), dim=0
    )
    kl_teacher = (p_t * (teacher_logps - mixture)).sum(-1)
    kl_student = (p_s * (student_logps - mixture)).sum(-1)
    return beta * kl_teacher + (1 - beta) * kl_student


@LOSSES.register
class GKDLoss(Loss):
    """Generalised knowledge distillation: the generalised Jensen-Shannon divergence between
    the teacher's (T) and the student's (S) next-token distributions at each label token::

        M = beta * T + (1 - beta) * S
        l_t = beta * KL(T || M) + (1 - beta) * KL(S || M)

    ``beta = 0`` is taken as the forward KL(T || S) (the limit of ``l / beta``), ``beta =
    1`` as the reverse KL(S || T); 0.5 is the symmetric JSD. Both distributions are the
    softmax of the logits divided by ``temperature``. ``loss = sum_t l_t`` over label
    tokens, ``num_tokens`` = their count. On-policy (the student's own samples as the
    batch) or off-policy (a dataset's responses) is the caller's choice of batch, not an
    option here. Reads the student's ``logits`` (or hidden states and head) from
    ``outputs`` and ``teacher_logits`` (B, T, V) from the keywords or ``inputs``; the two
    vocabularies must be the same size.
    """

    reads = LossInputs(required=("teacher_logits",))

    def __init__(
        self, beta: float = 0.5, temperature: float = 1.0, ignore_index: int = IGNORE_INDEX
    ) -> None:
        if not 0 <= beta <= 1:
            raise ValueError(f"GKDLoss: beta must lie in [0, 1], got {beta}")
        if not 0 < temperature < float("inf"):
            raise ValueError(f"GKDLoss: temperature must be a positive number, got {temperature}")
        self.beta, self.temperature, self.ignore_index = beta, temperature, ignore_index

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = type(self).__name__
        labels = token_labels(inputs, owner, outputs_device(outputs))
        mask = label_mask(labels, self.ignore_index)
        num_tokens = count_label_tokens(mask, owner)
        teacher = require("teacher_logits", inputs, kwargs, owner=owner, hint=_TEACHER_HINT)
        teacher = torch.as_tensor(teacher, device=labels.device)
        rows, cols = mask.nonzero(as_tuple=True)
        student = _student_logits(outputs, rows, cols, owner)
        if teacher.ndim != 3 or teacher.shape[:2] != labels.shape:
            raise ValueError(
                f"{owner}: teacher_logits must have shape (B, T, V) matching labels "
                f"{tuple(labels.shape)}, got {tuple(teacher.shape)}"
            )
        if teacher.shape[-1] != student.shape[-1]:
            raise ValueError(
                f"{owner}: the teacher's vocabulary has {teacher.shape[-1]} entries and the "
                f"student's {student.shape[-1]}; distil between models sharing a tokenizer"
            )
        dtype = torch.float64 if student.dtype == torch.float64 else torch.float32
        student_logps = (student.to(dtype) / self.temperature).log_softmax(-1)
        teacher_logps = (teacher[rows, cols - 1].to(dtype) / self.temperature).log_softmax(-1)
        if not bool(torch.isfinite(teacher_logps).all()):
            raise ValueError(f"{owner}: teacher_logits hold NaN or infinite values")
        per_token = generalized_jsd(student_logps, teacher_logps.detach(), self.beta)
        with torch.no_grad():
            reverse_kl = (student_logps.exp() * (student_logps - teacher_logps)).sum()
        stats = {"tokens": num_tokens, "reverse_kl_sum": reverse_kl}
        return {"loss": per_token.sum(), "num_tokens": num_tokens, "distill_stats": stats}
