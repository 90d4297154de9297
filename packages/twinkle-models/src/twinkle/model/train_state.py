"""Everything one trainable unit (a LoRA adapter, or the full model) owns between steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

FULL_MODEL = "__full__"  # the state's key when training all parameters, with no adapter


@dataclass
class TrainState:
    """One adapter's optimizer, scheduler, loss, template, processor, counters and metrics.

    ``pending_tokens`` counts the loss normaliser (label tokens, for token-level
    losses) accumulated by backward passes since the last optimizer step: the
    step divides the summed gradients by it once, so uneven micro-batches give
    the gradient of one big batch with the same tokens.
    """

    name: str
    gradient_accumulation_steps: int = 1
    optimizer: torch.optim.Optimizer | None = None
    lr_scheduler: Any = None
    loss: Any = None
    template: Any = None
    processor: Any = None
    metrics: Any = None  # MetricCollection fed by forward_backward and each optimizer step
    eval_metrics: Any = None  # MetricCollection fed by forward_only
    pending_forward: tuple | None = None  # (batch, outputs) of forward()/forward_only()
    pending_loss: tuple | None = (
        None  # (summed loss, normaliser) of calculate_loss(), for backward()
    )
    window_start: float | None = None  # when the current optimizer step's first call began
    pending_tokens: float = 0.0
    accumulated_calls: int = 0
    step: int = 0
    last_grad_norm: float | None = None
    # The unit's own generators (a twinkle.model.unit_random.RandomStream) when its forwards
    # draw apart from the process's (a MultiLoraTransformersModel's tenants); None: the process's.
    random_stream: Any = None
