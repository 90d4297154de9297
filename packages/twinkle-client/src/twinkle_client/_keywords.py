"""Keyword arguments checked against a method's documented parameters, former names accepted.

Python's own error for a wrong keyword names only the wrong one; a user copying a sample with
a typo learns more from the list of the parameters the method takes and the closest match.
Parameters that were renamed keep their former name as an alias, so older scripts still run.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def keywords(owner: str, **former: str) -> Callable[[F], F]:
    """Check a method's keywords; ``former`` maps an old parameter name to its new one."""

    def wrap(method: F) -> F:
        signature = inspect.signature(method)
        names = [
            name
            for name, p in signature.parameters.items()
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        label = f"{owner}()" if method.__name__ == "__init__" else f"{owner}.{method.__name__}()"

        @functools.wraps(method)
        def checked(*args: Any, **kwargs: Any) -> Any:
            for old, new in former.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{label} got both {old!r} and {new!r}; pass only {new!r}")
                    kwargs[new] = kwargs.pop(old)
            unknown = [key for key in kwargs if key not in names]
            if unknown:
                raise TypeError(_unknown_message(label, unknown, names))
            return method(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return wrap


def _unknown_message(label: str, unknown: list[str], names: list[str]) -> str:
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, names, n=1, cutoff=0.5)
        hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    return f"{label} got unknown keyword {', '.join(hints)}; it takes {', '.join(names)}"
