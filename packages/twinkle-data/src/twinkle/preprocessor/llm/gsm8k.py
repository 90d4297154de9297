"""GSM8K-style math word problems become RL prompts whose ground truth rewards read back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.data_format import Trajectory
from twinkle.preprocessor.base import PREPROCESSORS, Preprocessor, RowFieldError, require

GSM8K_INSTRUCTION = (
    "Solve the problem step by step. On the last line, write the final answer as "
    "'#### <answer>', where <answer> is a number."
)


def gsm8k_final_answer(solution: str) -> str:
    """The number after the last ``####`` of a GSM8K solution, without thousands commas:
    ``'... #### 1,200'`` -> ``'1200'``."""
    if "####" not in solution:
        raise RowFieldError("answer", f"has no '#### <answer>' line: {solution[-80:]!r}")
    answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
    if not answer:
        raise RowFieldError("answer", "has nothing after '####'")
    return answer


@PREPROCESSORS.register
class GSM8KProcessor(Preprocessor):
    """``{'question', 'answer'}`` -> a prompt to be sampled (no assistant turn):
    an optional system message, then the user ``question`` followed by ``instruction``.

    ``user_data`` is ``[{'answer': '<final number>'}]``: the text after ``####`` in the
    dataset's ``answer``, commas removed, for accuracy rewards to compare against.
    Encode with ``add_generation_prompt=True``.
    """

    def __init__(self, instruction: str = GSM8K_INSTRUCTION, system: str | None = None) -> None:
        self.instruction = instruction
        self.system = system

    def __call__(self, row: Mapping[str, Any]) -> Trajectory:
        question = require(row, "question").strip()
        answer = gsm8k_final_answer(require(row, "answer"))
        messages = [{"role": "user", "content": f"{question}\n\n{self.instruction}"}]
        if self.system is not None:
            messages.insert(0, {"role": "system", "content": self.system})
        return Trajectory(messages=messages, user_data=[{"answer": answer}])
