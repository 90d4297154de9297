"""Arrays without torch: recognise tensors by duck typing, validate array fields, and
encode arrays as typed JSON lists.

twinkle-mesh installs without torch, so a tensor is anything with ``.detach()`` and
``.numpy()`` or with ``__array__``. Fields keep tensors as they are (training code hands
them around); plain lists become numpy arrays so ``feature['input_ids'].tolist()`` works
whichever form came in.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, ValidationInfo

ARRAY_KEY = "__ndarray__"
"""The single key of the dict that marks an encoded array on the wire."""

# Kinds that survive a round trip through JSON numbers: bool, signed, unsigned, float.
_WIRE_KINDS = "biuf"


def is_array_like(value: object) -> bool:
    """Whether ``value`` is a numpy array or a tensor-like object (numpy scalars are not)."""
    if isinstance(value, np.ndarray):
        return True
    if isinstance(value, (np.generic, type)):
        return False
    return hasattr(value, "__array__") or (hasattr(value, "detach") and hasattr(value, "numpy"))


def as_numpy(value: Any) -> np.ndarray:
    """Copy a tensor-like to host memory as a numpy array; a numpy array is returned as is."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):
        value = value.detach()
    if hasattr(value, "cpu"):
        value = value.cpu()
    if hasattr(value, "numpy"):
        try:
            return value.numpy()
        except TypeError:
            # numpy has no bfloat16: widen to float32, which holds every bfloat16 exactly.
            return value.float().numpy()
    return np.asarray(value)


def encode_array(value: Any) -> dict[str, dict[str, Any]]:
    """``{ARRAY_KEY: {dtype, shape, data}}`` with ``data`` flat in C order."""
    array = as_numpy(value)
    if array.dtype.kind not in _WIRE_KINDS:
        raise TypeError(
            f"cannot encode an array of dtype {array.dtype} to JSON; "
            "only bool, integer and float arrays travel on the wire"
        )
    return {
        ARRAY_KEY: {
            "dtype": array.dtype.name,
            "shape": list(array.shape),
            "data": array.reshape(-1).tolist(),
        }
    }


def decode_array(payload: object) -> np.ndarray:
    """Inverse of :func:`encode_array` (given the inner dict); checks everything, as the
    payload may come from an untrusted client."""
    if not isinstance(payload, dict) or set(payload) != {"dtype", "shape", "data"}:
        raise ValueError(f"an encoded array must be a dict with dtype, shape and data: {payload!r}")
    dtype_name, shape, data = payload["dtype"], payload["shape"], payload["data"]
    if not isinstance(dtype_name, str):
        raise ValueError(f"encoded array dtype must be a string, got {dtype_name!r}")
    try:
        dtype = np.dtype(dtype_name)
    except TypeError as err:
        raise ValueError(f"encoded array has an unknown dtype {dtype_name!r}") from err
    if dtype.kind not in _WIRE_KINDS:
        raise ValueError(f"encoded array has dtype {dtype_name!r}; expected bool, int or float")
    if not (
        isinstance(shape, list)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    ):
        raise ValueError(f"encoded array shape must be a list of non-negative ints: {shape!r}")
    if not isinstance(data, list):
        raise ValueError("encoded array data must be a flat list")
    if len(data) != int(np.prod(shape)):
        raise ValueError(f"encoded array has {len(data)} values but shape {shape}")
    try:
        raw = np.asarray(data)
    except ValueError as err:
        raise ValueError("encoded array data must be a flat list of numbers") from err
    if raw.size and (raw.ndim != 1 or not _fits(raw.dtype.kind, dtype.kind)):
        raise ValueError(f"encoded array data does not hold {dtype_name} values")
    array = raw.astype(dtype)
    if dtype.kind in "iu" and not np.array_equal(array, raw):
        raise ValueError(f"encoded array data does not fit in {dtype_name}")
    return array.reshape(shape)


def _fits(data_kind: str, dtype_kind: str) -> bool:
    """Whether JSON values parsed as ``data_kind`` may be stored as ``dtype_kind``."""
    if dtype_kind == "f":
        return data_kind in "iuf"
    if dtype_kind in "iu":
        return data_kind in "iu"
    return data_kind == "b"


def seq_len(array: Any) -> int:
    """Tokens along the last axis: the sequence axis of 1-D and batched features alike."""
    return int(array.shape[-1])


def _array_field(value: Any, info: ValidationInfo, kinds: str, what: str) -> Any:
    """Validate an array field: lists become numpy, arrays and tensors are kept."""
    name = info.field_name
    if isinstance(value, (list, tuple)):
        try:
            array = np.asarray(value)
        except ValueError as err:
            raise ValueError(f"{name} must be a rectangular list of {what}") from err
        if array.size == 0:
            array = array.astype(np.float64 if "f" in kinds else np.int64)
        elif array.dtype.kind not in kinds:
            raise ValueError(f"{name} must hold {what}, got a list of {array.dtype} values")
        elif array.dtype.kind in "iu" and "f" in kinds:
            array = array.astype(np.float64)
        value = array
    elif not is_array_like(value):
        raise ValueError(
            f"{name} must be a list, a numpy array or a tensor, got {type(value).__name__}"
        )
    elif not hasattr(value, "shape"):
        value = np.asarray(value)
    if isinstance(value, np.ndarray) and value.dtype.kind not in kinds:
        raise ValueError(f"{name} must hold {what}, got an array of dtype {value.dtype}")
    is_floating_point = getattr(value, "is_floating_point", None)
    if "f" not in kinds and callable(is_floating_point) and is_floating_point():
        raise ValueError(f"{name} must hold {what}, got a floating point tensor")
    if len(value.shape) == 0:
        raise ValueError(f"{name} must have at least one dimension, got a scalar")
    return value


def _int_array(value: Any, info: ValidationInfo) -> Any:
    return _array_field(value, info, "iu", "integers")


def _mask_array(value: Any, info: ValidationInfo) -> Any:
    return _array_field(value, info, "biu", "integers or booleans")


def _float_array(value: Any, info: ValidationInfo) -> Any:
    return _array_field(value, info, "iuf", "numbers")


IntArray = Annotated[Any, BeforeValidator(_int_array)]
"""Token ids, labels, positions: a list of ints becomes an int64 array."""
MaskArray = Annotated[Any, BeforeValidator(_mask_array)]
"""An attention mask: ints or booleans."""
FloatArray = Annotated[Any, BeforeValidator(_float_array)]
"""Logits, log-probabilities: a list of numbers becomes a float64 array."""
