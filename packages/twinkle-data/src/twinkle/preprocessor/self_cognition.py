"""Self-cognition rows (``query``/``response`` with ``{{NAME}}``/``{{AUTHOR}}``
placeholders) become a one-turn conversation about the model's own identity."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.data_format import Trajectory
from twinkle.preprocessor.base import PREPROCESSORS, Preprocessor, require


@PREPROCESSORS.register
class SelfCognitionProcessor(Preprocessor):
    """``{'query', 'response'}`` -> user ``query``, assistant ``response``, with every
    ``{{NAME}}`` replaced by ``model_name`` and ``{{AUTHOR}}`` by ``model_author`` in both.
    Other columns (such as ``tag``) are not used."""

    def __init__(self, model_name: str, model_author: str) -> None:
        for name, value in (("model_name", model_name), ("model_author", model_author)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        self.model_name = model_name
        self.model_author = model_author

    def fill(self, text: str) -> str:
        return text.replace("{{NAME}}", self.model_name).replace("{{AUTHOR}}", self.model_author)

    def __call__(self, row: Mapping[str, Any]) -> Trajectory:
        query = self.fill(require(row, "query"))
        response = self.fill(require(row, "response"))
        return Trajectory(
            messages=[
                {"role": "user", "content": query},
                {"role": "assistant", "content": response},
            ]
        )
