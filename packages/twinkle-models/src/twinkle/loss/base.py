"""The Loss protocol every Twinkle loss follows, and the conventions it relies on.

A loss is called as ``loss(inputs, outputs, **kwargs)`` and returns a dict with

* ``'loss'``: the SUM of the per-unit losses, not divided by anything;
* ``'num_tokens'``: the normaliser that sum is meant to be divided by, a 0-dim int64
  tensor (label tokens for token-level losses; each sequence-level loss says which unit
  it counts).

The model adds the sums and the normalisers of every micro-batch of an optimizer step
(and, with data parallelism, of every rank) and divides once. That single division is why
a step over uneven micro-batches gives the same gradient as one big batch, and why a loss
must never average on its own. A loss may return more keys (``logps``, ``predicted_ids``)
for metrics; those are detached.

Conventions shared by every component of twinkle-models:

* ``labels`` (B, T) are NOT shifted: ``labels[b, t]`` is the target token at position t,
  ``-100`` outside the loss, and the logits at position t - 1 predict it. ``labels[:, 0]``
  is never predicted (nothing precedes it) and is ignored.
* ``logps`` (B, T) are aligned with labels: ``logps[b, t] = log p(labels[b, t] | tokens < t)``
  and 0 where ``labels == -100`` and at t = 0. RL inputs ``old_logps``, ``ref_logps`` and
  per-token ``advantages`` use the same alignment; per-sequence advantages have shape (B,).
* ``outputs`` hold ``logps`` (B, T), or ``logits`` (B, T, V), or ``hidden_states``
  (B, T, H) with ``lm_head_weight`` (V, H) (and optionally ``lm_head_bias`` (V,)), from
  which logits are computed chunk by chunk (see ``twinkle.loss.logps``).
* Loss-specific fields (``advantages``, ``old_logps``, ``ref_logps``, ...) are read from
  the keyword arguments or from ``inputs``; giving one in both places is an error.
* A loss declares the keywords it reads in ``reads`` (a ``LossInputs``). The model's
  ``forward_backward``, ``forward_only`` and ``calculate_loss`` refuse any other keyword
  before the forward, naming the closest known one, so a misspelt ``advantage=`` is an error
  rather than a step trained without advantages. A loss that leaves ``reads`` as None (a
  user's subclass written before it existed, or a plain callable) is handed every keyword
  unchecked, with one warning per class.
* Sequence-level losses (GSPO, DPO) and per-sequence advantages treat each row as one
  sequence: feed them padded rows, not packed ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

IGNORE_INDEX = -100


@dataclass(frozen=True)
class LossInputs:
    """The keyword inputs a loss reads: ``required`` ones it refuses to run without (given
    as keywords or in ``inputs``), ``optional`` ones it reads when present."""

    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return self.required + self.optional

    def describe(self) -> str:
        """The inputs as an error message lists them."""
        named = [f"{name} (required)" for name in self.required] + list(self.optional)
        return ", ".join(named) or "no keyword inputs"


class Loss(ABC):
    """Base class of every loss; subclasses document their formula and declare the keyword
    inputs they read in ``reads`` (None: undeclared, every keyword is passed unchecked)."""

    reads: ClassVar[LossInputs | None] = None

    @abstractmethod
    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        """Return ``{'loss': sum of per-unit losses, 'num_tokens': their count, ...}``."""
