"""TwinkleModel: the contract every model backend (Transformers, Megatron) honours.

The user owns the loop; a backend owns one step's mechanics::

    model.forward_backward(inputs=batch)   # forward, loss, backward; gradients accumulate
    model.clip_grad_and_step()             # every gradient_accumulation_steps calls: step
    model.calculate_metric(is_training=True)

Every method takes ``adapter_name=`` to pick which trainable unit it acts on
(a LoRA adapter, or the full model when there is none); the default is the only
adapter, or the one named 'default'.

Loss normalisation happens in one place: losses return the SUM of their
per-token terms and the number of tokens; backward passes accumulate both, and
the optimizer step divides the summed gradients by the accumulated count once.
A step over uneven micro-batches (and data ranks) therefore has exactly the
gradient of one batch holding the same tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from twinkle.data_format import ModelOutput


class TwinkleModel(ABC):
    """A trainable model with named adapters, driven by a user-written loop."""

    @abstractmethod
    def add_adapter_to_model(
        self, adapter_name: str, config_or_path: Any, gradient_accumulation_steps: int = 1
    ) -> None:
        """Add a trainable adapter (a peft config, or the folder of a saved adapter)."""

    @abstractmethod
    def forward_backward(
        self, inputs: Any, *, adapter_name: str | None = None, **kwargs
    ) -> ModelOutput:
        """Forward, loss and backward over ``inputs``; gradients accumulate until a step."""

    @abstractmethod
    def forward_only(
        self, inputs: Any, *, adapter_name: str | None = None, **kwargs
    ) -> ModelOutput:
        """Forward without gradients: per-token logps (and the loss when labels are present)."""

    @abstractmethod
    def clip_grad_and_step(
        self,
        max_grad_norm: float = 1.0,
        gradient_accumulation_steps: int | None = None,
        *,
        adapter_name: str | None = None,
    ) -> float | None:
        """Clip, step the optimizer and scheduler, zero gradients: every N-th call for N-step
        gradient accumulation. Returns the gradient norm when it stepped, else None."""

    @abstractmethod
    def set_optimizer(
        self, optimizer_cls: Any = "AdamW", *, adapter_name: str | None = None, **kwargs
    ) -> None:
        """Build the optimizer of an adapter by registry name or class."""

    @abstractmethod
    def set_lr_scheduler(
        self,
        scheduler_cls: Any = "CosineWarmupScheduler",
        *,
        adapter_name: str | None = None,
        **kwargs,
    ) -> None:
        """Build the learning-rate scheduler of an adapter by registry name or class."""

    @abstractmethod
    def calculate_metric(
        self, is_training: bool = True, *, adapter_name: str | None = None
    ) -> dict[str, float]:
        """The metrics accumulated since the last call, as floats; resets them."""

    @abstractmethod
    def save(
        self, name: str, output_dir: str = "output", *, adapter_name: str | None = None, **kwargs
    ) -> str:
        """Write a complete checkpoint folder atomically; returns its path."""

    @abstractmethod
    def resume_from_checkpoint(
        self, path: str, resume_only_model: bool = False, *, adapter_name: str | None = None
    ) -> dict[str, int]:
        """Restore a checkpoint; returns {'consumed_train_samples': ..., 'step': ...}."""
