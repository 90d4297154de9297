"""Patch: a change to a loaded Hugging Face model that makes it train correctly in a setting
its own code does not handle (packed sequences, sequence parallel, ...).

A patch touches module instances, never classes, so two models in one process can be
patched differently, and applying it twice changes nothing the second time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from torch import nn

from twinkle.utils import Registry

APPLIED = "_twinkle_patches"
"""Attribute of a patched model: the names of the patches applied to it."""


class Patch(ABC):
    """Base class: ``applies_to(model)`` says whether the model has what the patch fixes;
    ``apply(model)`` patches it once (later calls return False and change nothing).

    Subclasses implement ``applies_to`` and ``_patch``. ``for_packed_batches = True``
    asks ``apply_for_batch`` to apply the patch when a packed batch meets the model.
    """

    for_packed_batches: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return type(self).__name__

    @abstractmethod
    def applies_to(self, model: nn.Module) -> bool:
        """Whether ``model`` has the layers this patch fixes."""

    @abstractmethod
    def _patch(self, model: nn.Module) -> None:
        """Change ``model``'s module instances; called once per model."""

    def is_applied(self, model: nn.Module) -> bool:
        return self.name in getattr(model, APPLIED, ())

    def apply(self, model: nn.Module) -> bool:
        """Patch ``model`` unless already done; True when this call changed it."""
        if self.is_applied(model):
            return False
        if not self.applies_to(model):
            raise ValueError(
                f"{self.name} does not apply to {type(model).__name__}: the model has none of "
                "the layers it patches"
            )
        self._patch(model)
        setattr(model, APPLIED, frozenset({*getattr(model, APPLIED, ()), self.name}))
        return True


PATCHES: Registry = Registry("patch", base=Patch)
"""Patches by name: ``PATCHES.get('GatedDeltaNetPaddingFreePatch')``."""
