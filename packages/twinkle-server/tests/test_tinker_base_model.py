"""A Tinker request's base_model: the served model's own id, or its bare repo id (as the
documents' samples pass it, ``base_model[len('ms://'):]``); anything else is a 400."""

from __future__ import annotations

import pytest

from twinkle.server.errors import BadRequest
from twinkle.server.tinker.base_model import check_base_model


@pytest.mark.parametrize("asked", [None, "ms://Qwen/Qwen3-4B", "Qwen/Qwen3-4B"])
def test_the_served_hub_model_is_taken_by_its_id_or_bare_repo_id(asked):
    check_base_model("ms://Qwen/Qwen3-4B", asked, "trains")


@pytest.mark.parametrize("asked", ["Qwen/Qwen3-8B", "hf://Qwen/Qwen3-4B", "Qwen3-4B"])
def test_another_model_is_refused_naming_the_served_one(asked):
    with pytest.raises(BadRequest, match=r"this server trains 'ms://Qwen/Qwen3-4B', not"):
        check_base_model("ms://Qwen/Qwen3-4B", asked, "trains")


def test_a_bundled_model_is_taken_only_by_its_own_id():
    check_base_model("bundled://tiny-qwen3", "bundled://tiny-qwen3", "samples")
    with pytest.raises(BadRequest, match="pass base_model='bundled://tiny-qwen3'"):
        check_base_model("bundled://tiny-qwen3", "tiny-qwen3", "samples")
