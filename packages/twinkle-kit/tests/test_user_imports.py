"""Every import statement in the user's documents resolves, or is pending a named capability.

The list comes from ``shared/seeds/IMPORTS.txt`` beside the repository. A line
listed in PENDING must still fail to import: when the capability lands, this
test fails until its lines are removed from PENDING, so the list stays true.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

IMPORTS_FILE = Path(__file__).resolve().parents[3].parent / "shared" / "seeds" / "IMPORTS.txt"

# statement -> the capability it waits for (empty: every documented import works)
PENDING: dict[str, str] = {}


def user_imports() -> list[str]:
    if not IMPORTS_FILE.is_file():
        raise FileNotFoundError(
            f"{IMPORTS_FILE} is missing: the user's documents live in shared/ beside the repo"
        )
    lines = IMPORTS_FILE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


PROBE = """
import json, sys
errors = {}
for statement in json.loads(sys.argv[1]):
    try:
        exec(statement, {})
    except Exception as exc:
        errors[statement] = f"{type(exc).__name__}: {exc}"
print(json.dumps(errors))
"""


@pytest.fixture(scope="module")
def import_errors() -> dict[str, str]:
    """Try every statement in one fresh interpreter (one torch import, not fifty)."""
    statements = json.dumps(user_imports())
    done = subprocess.run(
        [sys.executable, "-c", PROBE, statements], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_pending_list_names_only_statements_from_the_documents():
    assert set(PENDING) <= set(user_imports())


@pytest.mark.parametrize("statement", user_imports())
def test_user_import(statement, import_errors):
    error = import_errors.get(statement)
    if statement in PENDING:
        assert error is not None, (
            f"{statement!r} now resolves: remove it from PENDING ({PENDING[statement]})"
        )
    else:
        assert error is None, f"{statement!r} fails: {error}"
