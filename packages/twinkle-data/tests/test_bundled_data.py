"""The bundled datasets: the right shape and size, correct content, and reproducible builds.

GSM8K answers are recomputed exactly (every calculator note, every operand
traced back to the question or an earlier step, the final answer); every
Countdown target is re-solved from its numbers by brute force.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import operator
import re
from fractions import Fraction
from functools import cache
from itertools import combinations
from pathlib import Path

import pytest

from twinkle.hub import resolve_dataset

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_bundled_datasets.py"
CJK = re.compile(r"[\u4e00-\u9fff]")
NOTE = re.compile(r"<<([^=<>]+)=([^<>]+)>>(\S+)")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


SUBSETS = {"gsm8k": "main"}


def load(name: str, split: str) -> list[dict]:
    path = resolve_dataset(f"bundled://{name}") / SUBSETS.get(name, "") / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def self_cognition() -> list[dict]:
    return load("self-cognition", "train")


@pytest.fixture(scope="module", params=["train", "test"])
def gsm8k(request) -> list[dict]:
    return load("gsm8k", request.param)


@pytest.fixture(scope="module", params=["train", "test"])
def countdown(request) -> list[dict]:
    return load("countdown", request.param)


def exact(expr: str) -> Fraction:
    """The exact value of an arithmetic expression of integers, + - * / and parentheses."""

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            return walk(node.left) / walk(node.right)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        raise AssertionError(f"not plain arithmetic: {expr!r}")

    return walk(ast.parse(expr, mode="eval").body)


@cache
def reachable(values: tuple[Fraction, ...], target: Fraction) -> bool:
    """Whether ``target`` can be made with + - * / using every value exactly once."""
    if len(values) == 1:
        return values[0] == target
    for i, j in combinations(range(len(values)), 2):
        a, b = values[i], values[j]
        rest = [v for k, v in enumerate(values) if k not in (i, j)]
        results = {a + b, a - b, b - a, a * b}
        results |= {a / b} if b else set()
        results |= {b / a} if a else set()
        if any(reachable(tuple(sorted([*rest, r])), target) for r in results):
            return True
    return False


# self-cognition


def test_self_cognition_has_fifty_chinese_and_fifty_english_pairs(self_cognition):
    assert all(set(row) == {"query", "response", "tag"} for row in self_cognition)
    assert [row["tag"] for row in self_cognition].count("zh") == 50
    assert [row["tag"] for row in self_cognition].count("en") == 50
    assert len({row["query"] for row in self_cognition}) == 100
    assert len({row["response"] for row in self_cognition}) == 100


def test_self_cognition_tags_match_the_language(self_cognition):
    for row in self_cognition:
        text = row["query"] + row["response"]
        assert bool(CJK.search(text)) == (row["tag"] == "zh"), row


def test_every_self_cognition_answer_has_a_placeholder_and_no_unknown_ones(self_cognition):
    responses = [row["response"] for row in self_cognition]
    assert all("{{NAME}}" in r or "{{AUTHOR}}" in r for r in responses)
    assert sum("{{NAME}}" in r for r in responses) >= 90
    assert sum("{{AUTHOR}}" in r for r in responses) >= 80
    for row in self_cognition:
        text = row["query"] + row["response"]
        assert set(re.findall(r"\{\{(\w*)\}\}", text)) <= {"NAME", "AUTHOR"}
        assert text.count("{") == text.count("}"), row


# gsm8k


def test_gsm8k_splits_have_the_documented_sizes_and_no_overlap():
    train, test = load("gsm8k", "train"), load("gsm8k", "test")
    assert (len(train), len(test)) == (500, 100)
    questions = [row["question"] for row in train + test]
    assert len(set(questions)) == 600


def test_every_gsm8k_answer_is_arithmetically_correct(gsm8k):
    for row in gsm8k:
        assert set(row) == {"question", "answer"}
        *steps, final = row["answer"].split("\n")
        assert re.fullmatch(r"#### \d+", final), row
        known = {Fraction(int(n)) for n in re.findall(r"\d+", row["question"])} | {2, 100}
        last = None
        for line in steps:
            notes = NOTE.findall(line)
            assert notes, f"step without a calculator note: {line!r}"
            for expr, claimed, written in notes:
                value = exact(expr)
                assert value == Fraction(claimed) == Fraction(written), (expr, claimed, written)
                operands = {Fraction(int(n)) for n in re.findall(r"\d+", expr)}
                assert operands <= known, f"{expr!r} uses a number from nowhere: {row}"
                assert line.startswith(expr) or f" {expr} = <<" in line, line
                known.add(value)
                last = value
        assert last == int(final.removeprefix("#### ")), row


def test_gsm8k_mixes_many_kinds_of_reasoning(gsm8k):
    def operators(row: dict) -> str:
        notes = NOTE.findall(row["answer"])
        return "|".join(re.sub(r"[\d()]", "", expr) for expr, _, _ in notes)

    assert len({operators(row) for row in gsm8k}) >= 10


# countdown


def test_countdown_rows_have_three_or_four_numbers_and_an_int_target(countdown):
    for row in countdown:
        assert set(row) == {"nums", "target"}
        assert len(row["nums"]) in (3, 4)
        assert all(type(n) is int and 1 <= n <= 99 for n in row["nums"])
        assert type(row["target"]) is int and 10 <= row["target"] <= 200
    assert {len(row["nums"]) for row in countdown} == {3, 4}


def test_every_countdown_target_is_reachable_using_each_number_once(countdown):
    for row in countdown:
        values = tuple(sorted(Fraction(n) for n in row["nums"]))
        assert reachable(values, Fraction(row["target"])), row


def test_the_solver_rejects_unreachable_targets():
    assert reachable((Fraction(2), Fraction(3), Fraction(4)), Fraction(24))
    assert not reachable((Fraction(1), Fraction(1), Fraction(1)), Fraction(50))


def test_countdown_splits_have_the_documented_sizes_and_no_duplicates():
    train, test = load("countdown", "train"), load("countdown", "test")
    assert (len(train), len(test)) == (500, 100)
    keys = {(tuple(sorted(row["nums"])), row["target"]) for row in train + test}
    assert len(keys) == 600


# reproducibility


def test_the_build_script_reproduces_the_committed_files_byte_for_byte(tmp_path):
    spec = importlib.util.spec_from_file_location("build_bundled_datasets", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.build(tmp_path)
    committed = resolve_dataset("bundled://gsm8k").parent
    built = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.jsonl"))
    assert built == sorted(p.relative_to(committed) for p in committed.rglob("*.jsonl"))
    assert len(built) == 5
    for relative in built:
        assert (tmp_path / relative).read_bytes() == (committed / relative).read_bytes(), relative
