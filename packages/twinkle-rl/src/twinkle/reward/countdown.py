"""Countdown accuracy: the equation in ``<answer>`` uses each number once and hits the target.

The equation is evaluated by walking its syntax tree (numbers, + - * /, parentheses), never
by ``eval``: a completion is untrusted text.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Sequence
from typing import Any

from twinkle.reward.base import Reward
from twinkle.reward.completion import completion_text, ground_truth

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression; ValueError for anything else."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div):
                if right == 0:
                    raise ValueError("division by zero")
                return left / right
            if type(node.op) in _OPERATORS:
                return _OPERATORS[type(node.op)](left, right)
        raise ValueError(f"not plain arithmetic: {ast.dump(node)[:60]}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an expression: {expression!r}") from err
    return walk(tree.body)


def countdown_score(completion: str, target: int, nums: Sequence[int]) -> float:
    """1.0 when the last ``<answer>`` holds an equation over exactly ``nums`` equal to
    ``target`` (an ``= target`` suffix is allowed), else 0.0."""
    answers = _ANSWER.findall(completion)
    if not answers:
        return 0.0
    equation = answers[-1].split("=")[0]
    if sorted(int(n) for n in re.findall(r"\d+", equation)) != sorted(nums):
        return 0.0
    try:
        value = evaluate(equation)
    except ValueError:
        return 0.0
    return float(abs(value - float(target)) < 1e-5)


class CountdownAccuracyReward(Reward):
    """1.0 for a correct Countdown equation (``countdown_score``) against
    ``user_data[0]['target']`` and ``['nums']``, as CountdownProcessor stores them."""

    def __call__(
        self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None
    ) -> list[float]:
        owner = type(self).__name__
        return [
            countdown_score(
                completion_text(t),
                int(ground_truth(t, "target", owner)),
                [int(n) for n in ground_truth(t, "nums", owner)],
            )
            for t in trajectories
        ]
