"""The optimizer a trainable unit gets when a loop steps it before ``set_optimizer``, as the
documents' minimal single-card sample does (``clip_grad_and_step()`` right after
``forward_backward``): AdamW with torch's defaults (betas 0.9/0.999, eps 1e-8, weight decay
0.01 outside biases and norms) at lr 1e-4 for a LoRA adapter, 1e-5 for full training;
no lr scheduler. Call ``set_optimizer(...)`` (and ``set_lr_scheduler``) to choose your own.
"""

from __future__ import annotations

from twinkle.model.train_state import FULL_MODEL

DEFAULT_OPTIMIZER = "AdamW"
DEFAULT_LORA_LR = 1e-4
"""A LoRA adapter's default learning rate: the documents' fine-tuning setting."""
DEFAULT_FULL_LR = 1e-5
"""Full-parameter training's default learning rate: ten times smaller, as every weight moves."""


def default_lr(unit: str) -> float:
    """The default learning rate of the trainable unit named ``unit`` (an adapter's name, or
    ``FULL_MODEL``)."""
    return DEFAULT_FULL_LR if unit == FULL_MODEL else DEFAULT_LORA_LR
