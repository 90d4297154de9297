"""Number checks for request values that reach an optimizer, a loss or a sampler.

Python's JSON reader accepts ``NaN`` and ``Infinity``, and a comparison such as
``value < 0`` is False for NaN, so a range check written as a comparison lets NaN through.
These helpers test finiteness first, then the range, and raise a 400 that names the field
and the allowed range: ``adam_params.beta1 must be a finite number in [0, 1), got 5.0``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from twinkle.server.errors import BadRequest

INT64_MAX = 2**63 - 1


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    """The range as interval notation: ``[0, 1)``, ``(0, inf)``."""
    left = "(-inf" if low is None else f"{'(' if low_open else '['}{low:g}"
    right = "inf)" if high is None else f"{high:g}{')' if high_open else ']'}"
    return f"{left}, {right}"


def number(
    value: Any,
    name: str,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a float: a real number (not a bool), finite, within the bounds (closed
    unless ``low_open``/``high_open``; None: unbounded)."""
    span = _bounds(low, high, low_open, high_open)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{name} must be a finite number in {span}, got {value!r}")
    result = float(value)
    inside = math.isfinite(result)
    if inside and low is not None:
        inside = result > low if low_open else result >= low
    if inside and high is not None:
        inside = result < high if high_open else result <= high
    if not inside:
        raise BadRequest(f"{name} must be a finite number in {span}, got {value!r}")
    return result


def integer(value: Any, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int (not a bool, not a float) in ``[low, high]``."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    too_low = is_int and low is not None and value < low
    too_high = is_int and high is not None and value > high
    if not is_int or too_low or too_high:
        left = "-inf" if low is None else str(low)
        right = "inf" if high is None else str(high)
        raise BadRequest(f"{name} must be an int in [{left}, {right}], got {value!r}")
    return value


def finite_values(values: Any, name: str) -> None:
    """Every number in ``values`` (a list, nested lists or an array) is finite."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise BadRequest(f"{name} must hold numbers only") from None
    if not bool(np.isfinite(array).all()):
        raise BadRequest(f"{name} holds NaN or infinite values; every value must be finite")


def refuse_nulls(raw: dict[str, Any], names: Any, where: str) -> None:
    """A null in ``raw`` for a field of ``names`` is an error, not "use the default": the
    Tinker SDKs serialise through pydantic's JSON mode, which writes NaN and infinities as
    null, so ``AdamParams(learning_rate=nan)`` arrives as ``{"learning_rate": null}``."""
    nulls = sorted(name for name in names if name in raw and raw[name] is None)
    if nulls:
        raise BadRequest(
            f"{where} {', '.join(nulls)} {'is' if len(nulls) == 1 else 'are'} null (the Tinker "
            "SDK sends NaN and infinite values as null); give finite numbers"
        )
