"""The bundled multi-turn task: products of small numbers, with a calculator tool.

A task reads ``"7 * 12 = ?"``; the model is meant to call ``calculator`` with the
expression, read the result, and answer with the number alone. The task tests the whole
tool loop (the call, the parsed arguments, the observation, the answer that copies it).
The tasks are the 121 products of 2..12, split (seeded) by the pair into 97 for training
and 24 held out, so held-out success measures tool use on products never trained on: a
model that has not seen ``7 * 12`` can only answer it through the tool.

The operands are small so that the bundled tiny model (2 layers, hidden 64, random init)
can learn the copying on a CPU: every operand and product is one token of the bundled
tokenizer, and the prompt writes the numbers as the tool call does (``7 * 12``, no leading
space), so the call copies the prompt's tokens and the answer copies the observation's.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections.abc import Mapping
from typing import Any, Literal

from twinkle.env.tool_env import ToolEnv

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: operator.truediv,
}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
OPERANDS = range(2, 13)
HELD_OUT_FRACTION = 0.2


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers, + - * / // % and parentheses.

    Args:
        expression: the expression, such as "37 * 48".
    """
    if len(expression) > 200:
        raise ValueError("the expression is longer than 200 characters")
    value = _evaluate(ast.parse(expression.strip(), mode="eval").body)
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if abs(left) > 1e12 or abs(right) > 1e12:
            raise ValueError("numbers above 1e12 are not supported")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def arithmetic_tasks(split: Literal["train", "test"], seed: int = 0) -> list[dict[str, Any]]:
    """The task rows of one split, as Trajectory dicts whose ``user_data`` holds the answer."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    pairs = [(a, b) for a in OPERANDS for b in OPERANDS]
    random.Random(seed).shuffle(pairs)
    cut = int(len(pairs) * HELD_OUT_FRACTION)
    chosen = pairs[:cut] if split == "test" else pairs[cut:]
    return [task_row(a, b) for a, b in chosen]


def task_row(a: int, b: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": f"{a} * {b} = ?"}],
        "user_data": [{"answer": str(a * b), "expression": f"{a} * {b}"}],
    }


def answer_reward(answer: str, user_data: Mapping[str, Any]) -> float:
    """1.0 when the answer's last number is the product, else 0.0."""
    numbers = _NUMBER.findall(answer)
    return float(bool(numbers) and numbers[-1] == str(user_data["answer"]))


class ArithmeticToolEnv(ToolEnv):
    """The task's env: the calculator as the only tool, ``answer_reward`` as the reward."""

    def __init__(self, **tool_env_kwargs: Any) -> None:
        super().__init__([calculator], answer_reward, **tool_env_kwargs)
