"""Checks that turn what callers hand a metric into numbers, failing on anything else."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import torch


def scalar(value: object, what: str) -> torch.Tensor | float:
    """One number: a Python/NumPy real or a one-element tensor, detached. A tensor stays a
    tensor (on its device), so accumulating it needs no host sync."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            shape = tuple(value.shape)
            raise ValueError(f"{what} must be one number, got a tensor of shape {shape}")
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{what} must be a real number, got a {value.dtype} tensor")
        return value.detach().reshape(())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number, got {value!r} ({type(value).__name__})")
    return float(value)


def tensor_field(source: Mapping[str, Any], key: str, where: str, owner: str) -> torch.Tensor:
    """``source[key]`` as a tensor, or an error naming what is missing and who needs it."""
    if key not in source:
        present = ", ".join(map(str, source)) or "nothing"
        raise KeyError(f"{owner} needs {where}[{key!r}]; it has: {present}")
    value = source[key]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{owner}: {where}[{key!r}] must be a tensor, got {type(value).__name__}")
    return value


def _items(values: object, what: str) -> list[object]:
    if isinstance(values, torch.Tensor):
        if values.ndim != 1:
            raise ValueError(f"{what} must be one-dimensional, got shape {tuple(values.shape)}")
        return values.tolist()
    if hasattr(values, "tolist"):  # a NumPy array
        values = values.tolist()
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a list of numbers, got {type(values).__name__}")
    return list(values)


def finite_floats(values: object, what: str) -> list[float]:
    """A list of finite floats from a sequence, NumPy array or 1-D tensor of numbers."""
    result = []
    for index, value in enumerate(_items(values, what)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{what}[{index}] must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{what}[{index}] is {value}; every value must be finite")
        result.append(float(value))
    return result


def counts(values: object, what: str) -> list[int]:
    """A list of non-negative ints from a sequence, NumPy array or 1-D tensor."""
    result = []
    for index, value in enumerate(_items(values, what)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{what}[{index}] must be an int, got {value!r}")
        if value < 0:
            raise ValueError(f"{what}[{index}] is {value}; counts must be >= 0")
        result.append(int(value))
    return result
