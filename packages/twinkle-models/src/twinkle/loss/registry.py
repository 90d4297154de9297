"""The loss registry: ``set_loss('GRPOLoss', epsilon=0.2)`` and ``set_loss(GRPOLoss, ...)``
resolve here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twinkle.loss.base import Loss
from twinkle.utils import Registry

LOSSES: Registry[type[Loss]] = Registry("loss", base=Loss)


def build_loss(loss: str | type[Loss] | Callable[..., dict], **kwargs: Any) -> Callable[..., dict]:
    """A ready loss from a registered name, a Loss class (built with ``kwargs``), or an
    instance / callable following the Loss protocol (returned as is, so no ``kwargs``)."""
    if isinstance(loss, str | type):
        return LOSSES.get(loss)(**kwargs)
    if not callable(loss):
        raise TypeError(
            f"a loss is a registered name, a Loss class or a callable, got {loss!r}; "
            f"known names: {', '.join(LOSSES.names())}"
        )
    if kwargs:
        raise TypeError(
            f"keyword arguments {sorted(kwargs)} were given with an already built loss "
            f"{loss!r}; pass its class or name instead, or drop the arguments"
        )
    return loss
