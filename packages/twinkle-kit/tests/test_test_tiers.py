"""The root conftest's slow list names tests that exist: a renamed test would otherwise
drop back into the fast tier unnoticed."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _root_conftest():
    spec = importlib.util.spec_from_file_location("root_conftest", REPO / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_slow_entry_names_an_existing_test_function():
    for entry in _root_conftest().SLOW_TESTS:
        path, name = entry.split("::")
        source = REPO / path
        assert source.is_file(), f"{entry}: no such file"
        tests = {
            node.name
            for node in ast.parse(source.read_text(encoding="utf-8")).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test")
        }
        function = name.split("[")[0]
        assert any(t.startswith(function) for t in tests), f"{entry}: no test {function}*"
        if "[" in name:  # a parametrised prefix names the full function
            assert function in tests, f"{entry}: no test {function}"
