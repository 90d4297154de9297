"""reduction_tolerance: wide enough for any summation order, narrow enough to catch a wrong sum."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from twinkle.utils.testing import reduction_tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("terms", [16, 4096])
def test_sums_in_any_order_agree_within_the_tolerance(dtype, terms):
    rng = torch.Generator().manual_seed(terms)
    values = torch.randn(64, terms, generator=rng).to(dtype)
    exact = values.double().sum(-1)
    pairwise = values.sum(-1)  # torch's blocked reduction
    sequential = torch.zeros(64, dtype=dtype)
    for column in values.unbind(-1):  # one term at a time: the worst-conditioned order
        sequential = sequential + column
    tol = reduction_tolerance(exact, terms=terms, dtype=dtype)
    torch.testing.assert_close(pairwise.double(), exact, **tol)
    torch.testing.assert_close(sequential.double(), exact, **tol)


def test_a_sum_missing_one_chunk_is_outside_the_tolerance():
    values = torch.randn(8, 512, generator=torch.Generator().manual_seed(0))
    whole = values.sum(-1)
    tol = reduction_tolerance(whole, terms=512)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(values[:, :-8].sum(-1), whole, **tol)


def test_numpy_arrays_and_the_scale_of_the_absolute_part():
    expected = np.array([1e-9, 3.0], dtype=np.float32)
    tol = reduction_tolerance(expected, terms=4)
    assert tol["atol"] == pytest.approx(3.0 * tol["rtol"])
    assert tol["rtol"] == pytest.approx(8 * 2 * 2.0**-23)
    np.testing.assert_allclose(expected + np.float32(1e-7), expected, **tol)


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="terms must be >= 1"):
        reduction_tolerance(np.ones(2), terms=0)
    with pytest.raises(ValueError, match="no rounding model for dtype int64"):
        reduction_tolerance(np.ones(2, dtype=np.int64), terms=2)
