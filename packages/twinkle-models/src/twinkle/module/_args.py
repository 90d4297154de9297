"""Keyword checks for builders, so a misspelt or misplaced argument names what is accepted
instead of surfacing as a bare ``TypeError`` from deep inside a constructor."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def accepted_kwargs(cls: type) -> list[str] | None:
    """The keyword arguments ``cls(first, ...)`` takes after its first argument; None when it
    takes ``**kwargs`` (anything goes)."""
    params = list(inspect.signature(cls).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params[1:] if p.kind in _NAMED]


def check_kwargs(cls: type, kwargs: Mapping[str, object], kind: str) -> None:
    """Raise ``ValueError`` listing the accepted arguments when ``kwargs`` holds others."""
    accepted = accepted_kwargs(cls)
    if accepted is None:
        return
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ValueError(
            f"{kind} {cls.__name__} does not accept {', '.join(unknown)}; "
            f"it accepts: {', '.join(accepted) or '(nothing)'}"
        )
