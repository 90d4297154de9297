"""Apply the patches a packed (padding-free) batch needs, the first time one meets a model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from twinkle.kernel.varlen import is_packed
from twinkle.patch.base import APPLIED, PATCHES

CHECKED = "_twinkle_packed_patches_checked"


def is_packed_batch(batch: Mapping[str, Any]) -> bool:
    """Whether a collated batch holds several sequences in one row: it carries
    ``cu_seq_lens_q`` (``InputProcessor(padding_free=True)``), or a one-row batch's
    ``position_ids`` restart at 0 inside it."""
    if batch.get("cu_seq_lens_q") is not None:
        return True
    positions = batch.get("position_ids")
    return positions is not None and positions.shape[0] == 1 and is_packed(positions)


def apply_for_batch(model: nn.Module, batch: Mapping[str, Any]) -> list[str]:
    """Apply every registered packed-batch patch that fits ``model``, once, if ``batch`` is
    packed; returns the names applied by this call. Cheap after the first packed batch."""
    if getattr(model, CHECKED, False) or not is_packed_batch(batch):
        return []
    applied = []
    for name in PATCHES.names():
        patch = PATCHES.get(name)()
        if patch.for_packed_batches and patch.applies_to(model) and patch.apply(model):
            applied.append(name)
    setattr(model, CHECKED, True)
    return applied


__all__ = ["APPLIED", "apply_for_batch", "is_packed_batch"]
