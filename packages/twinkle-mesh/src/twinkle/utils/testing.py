"""Tolerances for comparing two computations of the same floating-point result.

Two paths that compute one value (chunked against one pass, a parallel layout against one
process, one CPU's vector kernels against another's) sum the same terms in different orders,
so they agree only up to rounding. That rounding depends on the dtype and on how many terms
were summed, not on the machine a test was written on: a fixed ``atol=1e-6`` passes where the
author ran it and fails where the kernels group the sums differently.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Headroom over the random-walk estimate: rounding errors are not independent, and a value
# can pass through a few reductions of similar size (a matmul, then a softmax, then a sum).
SAFETY = 8.0


def reduction_tolerance(expected: Any, *, terms: int, dtype: Any = None) -> dict[str, float]:
    """``rtol``/``atol`` for results that went through sums of up to ``terms`` terms.

    The rounding error of a sum grows like ``sqrt(terms) * eps`` (of ``dtype``, by default
    ``expected``'s) times the magnitudes summed. An element near zero is the cancellation of
    terms as large as the tensor's largest entries, so the absolute part scales with
    ``max|expected|`` rather than with the element. Pass the result to
    ``torch.testing.assert_close(actual, expected, **tol)`` or ``np.testing.assert_allclose``.
    """
    if terms < 1:
        raise ValueError(f"terms must be >= 1 (the length of the longest sum), got {terms}")
    rtol = SAFETY * math.sqrt(terms) * _eps(dtype if dtype is not None else expected.dtype)
    magnitudes = _magnitudes(expected)
    scale = float(magnitudes.max()) if magnitudes.size else 0.0
    return {"rtol": rtol, "atol": rtol * scale}


# Machine epsilon by dtype name: numpy's and torch's dtypes both print these names.
EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def _eps(dtype: Any) -> float:
    name = str(dtype).removeprefix("torch.")
    if name not in EPS:
        raise ValueError(f"no rounding model for dtype {dtype}; known: {sorted(EPS)}")
    return EPS[name]


def _magnitudes(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, without importing torch here
        values = values.detach().to("cpu").double().numpy()
    return np.abs(np.asarray(values, dtype=np.float64))
