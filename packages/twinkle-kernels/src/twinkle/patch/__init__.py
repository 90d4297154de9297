"""Patches applied to Hugging Face models so they train correctly where their own code does
not handle the setting (packed sequences in GatedDeltaNet linear attention, ...)."""

from twinkle.patch.base import PATCHES, Patch
from twinkle.patch.gated_delta_net import GatedDeltaNetPaddingFreePatch
from twinkle.patch.padding_free import apply_for_batch, is_packed_batch

__all__ = [
    "PATCHES",
    "GatedDeltaNetPaddingFreePatch",
    "Patch",
    "apply_for_batch",
    "is_packed_batch",
]
