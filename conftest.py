"""The test tiers of the whole workspace: tests that start processes are marked ``processes``.

``pytest -m "not processes"`` (``nox -s fast``) is the developer's loop; CI runs everything.
A test is in the slow tier when it uses a fixture that starts processes (torchrun, a Ray
cluster, a server subprocess), when its own code starts them, or when its module's helpers
do. Marking is automatic so a new test cannot land in the fast tier by forgetting a decorator.
"""

from __future__ import annotations

import ast
import inspect
import re
from functools import cache
from pathlib import Path

import pytest

# Fixtures (of the packages' conftest files) whose setup starts other processes.
PROCESS_FIXTURES = frozenset({"torchrun", "child_env", "ray_cluster", "server_process"})
# What a module that starts processes itself contains.
STARTS_PROCESSES = re.compile(
    r"\bsubprocess\.(?:run|Popen|call|check_call|check_output)\b|\bPopen\(|\bmultiprocessing\.\w"
    r"|\bray\.init\(|initialize\(\s*[\"']ray"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "processes: starts processes (torchrun, Ray, a server, a script); slow tier"
    )


@cache
def _helpers_start_processes(path: Path) -> bool:
    """Whether the module's code outside its test functions (helpers, fixtures) starts processes."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
    lines = source.splitlines()
    for test in tests:  # blank the tests out: what is left is shared by all of them
        start = min([test.lineno, *(d.lineno for d in test.decorator_list)]) - 1
        lines[start : test.end_lineno] = [""] * (test.end_lineno - start)
    return bool(STARTS_PROCESSES.search("\n".join(lines)))


def _starts_processes(item: pytest.Item) -> bool:
    if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    function = getattr(item, "function", None)
    if function is not None and STARTS_PROCESSES.search(inspect.getsource(function)):
        return True
    return _helpers_start_processes(Path(item.path))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _starts_processes(item):
            item.add_marker(pytest.mark.processes)
