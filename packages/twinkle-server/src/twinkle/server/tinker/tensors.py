"""Tinker tensors to numpy and back: the protobuf ``Tensor`` (dense bytes or sparse CSR) and
the JSON ``TensorData`` (``{data, dtype, shape?, sparse_crow_indices?, sparse_col_indices?}``).

Everything decoded here is client data: sizes are checked against the shape before any
buffer is read, and a malformed tensor is a ``BadRequest`` naming the field.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from twinkle.server.errors import BadRequest
from twinkle.server.limits import check_tensor_size
from twinkle.server.tinker import proto_schema as schema

if TYPE_CHECKING:
    from twinkle.server.config import Limits

PROTO_DTYPES: dict[int, np.dtype] = {
    schema.DTYPE_FLOAT32: np.dtype("<f4"),
    schema.DTYPE_INT64: np.dtype("<i8"),
    schema.DTYPE_INT32: np.dtype("<i4"),
}
JSON_DTYPES: dict[str, np.dtype] = {"float32": np.dtype(np.float32), "int64": np.dtype(np.int64)}


def _bfloat16(raw: bytes, what: str) -> np.ndarray:
    if len(raw) % 2:
        raise BadRequest(f"{what}: bfloat16 data has an odd number of bytes")
    return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)


def _buffer(raw: bytes, dtype: int, what: str) -> np.ndarray:
    if dtype == schema.DTYPE_BFLOAT16:
        return _bfloat16(raw, what)
    np_dtype = PROTO_DTYPES.get(dtype)
    if np_dtype is None:
        raise BadRequest(f"{what}: unsupported tensor dtype {dtype}; send float32 or int64")
    if len(raw) % np_dtype.itemsize:
        raise BadRequest(f"{what}: {len(raw)} bytes is not a whole number of {np_dtype} values")
    return np.frombuffer(raw, dtype=np_dtype)


def _check_shape(shape: list[int], what: str, limits: Limits) -> list[int]:
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in shape):
        raise BadRequest(f"{what}: shape {shape} must hold non-negative integers")
    check_tensor_size(shape, limits, what)
    return shape


def _densify(
    values: np.ndarray, crow: np.ndarray, col: np.ndarray, shape: list[int], what: str
) -> np.ndarray:
    """A CSR matrix as a dense array; unlisted cells are 0."""
    if len(shape) != 2:
        raise BadRequest(f"{what}: a sparse CSR tensor needs a 2-D shape, got {shape}")
    rows, cols = shape
    if len(crow) != rows + 1 or len(col) != len(values):
        raise BadRequest(
            f"{what}: sparse CSR needs {rows + 1} row pointers and one column per value, got "
            f"{len(crow)} row pointers, {len(col)} columns and {len(values)} values"
        )
    if crow[0] != 0 or crow[-1] != len(values) or bool(np.any(np.diff(crow) < 0)):
        raise BadRequest(f"{what}: sparse CSR row pointers must rise from 0 to the value count")
    if len(col) and (col.min() < 0 or col.max() >= cols):
        raise BadRequest(f"{what}: a sparse CSR column index lies outside 0..{cols - 1}")
    dense = np.zeros((rows, cols), dtype=values.dtype)
    row_of_value = np.repeat(np.arange(rows), np.diff(crow))
    dense[row_of_value, col] = values
    return dense


def tensor_from_proto(msg: Any, what: str, limits: Limits) -> np.ndarray:
    """A protobuf ``Tensor`` as a dense numpy array (int64 or float32), at most
    ``limits.max_tensor_elements`` values."""
    shape = _check_shape(list(msg.shape), what, limits)
    encoding = msg.WhichOneof("encoding")
    if encoding == "sparse_csr":
        csr = msg.sparse_csr
        values = _buffer(csr.values, msg.dtype, what)
        crow = _buffer(csr.crow_indices, schema.DTYPE_INT64, what)
        col = _buffer(csr.col_indices, schema.DTYPE_INT64, what)
        array = _densify(values, crow, col, shape, what)
    else:
        array = _buffer(msg.dense, msg.dtype, what)
        if shape and math.prod(shape) != array.size:
            raise BadRequest(f"{what}: shape {shape} does not hold {array.size} values")
        array = array.reshape(shape) if shape else array
    return _widen(array)


def tensor_from_json(obj: Any, what: str, limits: Limits) -> np.ndarray:
    """A JSON ``TensorData`` as a dense numpy array (int64 or float32), at most
    ``limits.max_tensor_elements`` values."""
    if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
        raise BadRequest(f"{what} must be a TensorData object: {{data: [numbers], dtype, shape}}")
    dtype = JSON_DTYPES.get(obj.get("dtype"))
    if dtype is None:
        raise BadRequest(f"{what}: dtype must be 'float32' or 'int64', got {obj.get('dtype')!r}")
    try:
        values = np.asarray(obj["data"], dtype=dtype)
    except (TypeError, ValueError):
        raise BadRequest(f"{what}: data must be a flat list of numbers") from None
    if values.ndim != 1:
        raise BadRequest(f"{what}: data must be a flat list of numbers (row-major)")
    shape = obj.get("shape")
    shape = _check_shape(list(shape), what, limits) if isinstance(shape, list) else None
    crow, col = obj.get("sparse_crow_indices"), obj.get("sparse_col_indices")
    if crow is not None or col is not None:
        if not isinstance(crow, list) or not isinstance(col, list) or shape is None:
            raise BadRequest(
                f"{what}: a sparse tensor needs sparse_crow_indices, sparse_col_indices and shape"
            )
        try:
            crow_array = np.asarray(crow, dtype=np.int64)
            col_array = np.asarray(col, dtype=np.int64)
        except (TypeError, ValueError):
            raise BadRequest(f"{what}: sparse indices must be lists of integers") from None
        return _densify(values, crow_array, col_array, shape, what)
    if shape is None:
        return values
    if math.prod(shape) != values.size:
        raise BadRequest(f"{what}: shape {shape} does not hold {values.size} values")
    return values.reshape(shape)


def _widen(array: np.ndarray) -> np.ndarray:
    """int32 to int64 and bfloat16 (already float32) as is: two public dtypes only."""
    return array.astype(np.int64) if array.dtype.kind in "iu" else array.astype(np.float32)


def json_dtype(array: np.ndarray) -> str:
    return "int64" if array.dtype.kind in "iub" else "float32"


def tensor_to_json(array: np.ndarray) -> dict[str, Any]:
    """A numpy array as a JSON ``TensorData``."""
    dtype = json_dtype(array)
    flat = np.ascontiguousarray(array, dtype=JSON_DTYPES[dtype]).reshape(-1)
    return {"data": flat.tolist(), "dtype": dtype, "shape": list(array.shape)}
