"""The keywords a model call hands its loss, checked against the inputs the loss declares.

``forward_backward(inputs, advantage=...)`` (for ``advantages``) would otherwise train
without the advantages and without a word: the keyword lands in the loss's ``**kwargs``,
which reads the names it knows and nothing else. ``check_loss_keywords`` runs before the
forward and refuses a keyword neither the loss (``Loss.reads``) nor the call itself takes.

A loss that declares nothing (``reads`` None: a user's ``Loss`` subclass or a plain
callable) keeps working: every keyword is handed to it unchecked, and one warning per loss
class says how to declare its inputs. A subclass that overrides ``__call__`` or
``read_extra`` declares its own (``declared_inputs``).
"""

from __future__ import annotations

import difflib
import inspect
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from twinkle.loss import LOSSES, LossInputs

_WARNED: set[str] = set()
_READERS = ("__call__", "read_extra")
_NOT_KEYWORDS = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)


def check_loss_keywords(loss: Any, kwargs: Mapping[str, Any], call: Callable[..., Any]) -> None:
    """Refuse a keyword of ``call`` (a model method taking ``**loss_kwargs``) that ``loss``
    does not read; ``loss`` None (no loss set yet) is left for the loss lookup to name."""
    if not kwargs or loss is None:
        return
    declared = declared_inputs(loss)
    if declared is None:
        _warn_undeclared(loss, call.__name__)
        return
    params = [
        name
        for name, param in inspect.signature(call).parameters.items()
        if param.kind not in _NOT_KEYWORDS and name not in ("self", "inputs")
    ]
    unknown = unknown_keywords(declared, kwargs, params)
    if unknown:
        them = "them" if unknown.startswith("keywords") else "it"
        raise TypeError(
            f"{call.__name__} got unknown {unknown}: nothing in the call reads {them}. The loss "
            f"{type(loss).__name__} accepts {declared.describe()}; {call.__name__} itself "
            f"takes {', '.join(params)}{_other_losses(kwargs, declared)}"
        )


def _other_losses(kwargs: Mapping[str, Any], declared: LossInputs) -> str:
    """Which registered losses read a refused keyword: advantages given to the default
    CrossEntropyLoss usually mean a policy loss was never set."""
    hints = []
    for key in kwargs:
        if key in declared.names:
            continue
        readers = [name for name in LOSSES.names() if key in _names(LOSSES.get(name).reads)]
        if readers:
            shown = ", ".join(readers[:3]) + (", ..." if len(readers) > 3 else "")
            hints.append(f"{key!r} is read by {shown}")
    return f". {'; '.join(hints)}: choose one with set_loss" if hints else ""


def _names(reads: LossInputs | None) -> tuple[str, ...]:
    return reads.names if isinstance(reads, LossInputs) else ()


def declared_inputs(loss: Any) -> LossInputs | None:
    """The inputs ``loss`` declares, or None. A subclass that overrides a method reading the
    keywords (``__call__``, ``read_extra``) without declaring ``reads`` itself may read more
    than its parent declared, so it counts as undeclared: a user's ``MyLoss(CrossEntropyLoss)``
    reading a keyword of its own keeps working."""
    for cls in type(loss).__mro__:
        if "reads" in vars(cls):
            return cls.reads if isinstance(cls.reads, LossInputs) else None
        if any(name in vars(cls) for name in _READERS):
            return None
    return None


def unknown_keywords(declared: LossInputs, given: Iterable[str], also: Iterable[str] = ()) -> str:
    """The names in ``given`` that neither ``declared`` nor ``also`` holds, each with the
    closest known name ("keyword 'advantage' (did you mean 'advantages'?)"); '' if none."""
    known = [*declared.names, *also]
    unknown = [name for name in given if name not in known]
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        parts.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    if not parts:
        return ""
    return ("keyword " if len(parts) == 1 else "keywords ") + ", ".join(parts)


def _warn_undeclared(loss: Any, call: str) -> None:
    owner = type(loss).__qualname__ if not inspect.isfunction(loss) else loss.__qualname__
    if owner in _WARNED:
        return
    _WARNED.add(owner)
    warnings.warn(
        f"the loss {owner} declares no inputs (reads = None), so {call} hands it every "
        f"keyword unchecked and a misspelt one is ignored; declare them on the class: "
        f"reads = twinkle.loss.LossInputs(required=(...), optional=(...))",
        UserWarning,
        stacklevel=3,
    )
