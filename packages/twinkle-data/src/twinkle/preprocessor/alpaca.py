"""Alpaca rows (``instruction``, optional ``input``, ``output``) become one turn."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.data_format import Trajectory
from twinkle.preprocessor.base import PREPROCESSORS, Preprocessor, require, system_turn


@PREPROCESSORS.register
class AlpacaProcessor(Preprocessor):
    """``{'instruction', 'input', 'output'}`` -> user ``instruction`` (followed by a blank
    line and ``input`` when ``input`` is non-empty), assistant ``output``. A non-empty
    ``system`` column, when the dataset has one, becomes the system message."""

    def __call__(self, row: Mapping[str, Any]) -> Trajectory:
        instruction = require(row, "instruction")
        extra = require(row, "input") if row.get("input") else ""
        query = f"{instruction}\n\n{extra}" if extra else instruction
        messages = system_turn(row) + [
            {"role": "user", "content": query},
            {"role": "assistant", "content": require(row, "output")},
        ]
        return Trajectory(messages=messages)
