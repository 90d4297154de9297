"""The shared number checks: NaN, infinities, bools and out-of-range values are 400s that
name the field and the range."""

from __future__ import annotations

import math

import numpy as np
import pytest

from twinkle.server.checks import finite_values, integer, number, refuse_nulls
from twinkle.server.errors import BadRequest


@pytest.mark.parametrize(
    ("value", "kwargs", "message"),
    [
        (math.nan, {"low": 0}, "lr must be a finite number in [0, inf), got nan"),
        (math.inf, {"low": 0}, "got inf"),
        (-math.inf, {}, "in (-inf, inf)"),
        (5.0, {"low": 0, "high": 1, "high_open": True}, "in [0, 1), got 5.0"),
        (0.0, {"low": 0, "low_open": True}, "in (0, inf), got 0.0"),
        (True, {}, "got True"),
        ("0.1", {}, "got '0.1'"),
    ],
)
def test_number_refuses_non_finite_wrong_typed_and_out_of_range_values(value, kwargs, message):
    with pytest.raises(BadRequest, match="lr must be a finite number") as caught:
        number(value, "lr", **kwargs)
    assert message in caught.value.message


def test_number_accepts_the_bounds_it_includes():
    assert number(0, "x", low=0, high=1) == 0.0
    assert number(1, "x", low=0, high=1) == 1.0
    assert number(0.5, "x", low=0, high=1, low_open=True, high_open=True) == 0.5


@pytest.mark.parametrize("value", [2**70, -1, 1.0, True, None])
def test_integer_refuses_values_outside_its_range(value):
    with pytest.raises(BadRequest, match=r"seed must be an int in \[0, 9223372036854775807\]"):
        integer(value, "seed", 0, 2**63 - 1)


def test_finite_values_finds_one_nan_in_nested_lists():
    finite_values([[1.0, 2.0], [3.0, 4.0]], "advantages")
    with pytest.raises(BadRequest, match="advantages holds NaN or infinite values"):
        finite_values([[1.0, 2.0], [np.nan, 4.0]], "advantages")
    with pytest.raises(BadRequest, match="old_logps must hold numbers only"):
        finite_values([1.0, "x"], "old_logps")


def test_refuse_nulls_names_the_null_fields_and_ignores_absent_ones():
    refuse_nulls({"lr": 0.1}, ("lr", "eps"), "adam_params")
    with pytest.raises(BadRequest, match="adam_params eps, lr are null .*NaN and infinite"):
        refuse_nulls({"lr": None, "eps": None, "other": None}, ("lr", "eps"), "adam_params")
