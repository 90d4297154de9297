"""The one-way dependency rule of DESIGN.md §1 holds, and its checker catches a violation."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CHECKER = ROOT / "tools" / "check_imports.py"


def run_checker(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECKER), str(root)], capture_output=True, text=True)


def test_workspace_follows_the_rule():
    done = run_checker(ROOT)
    assert done.returncode == 0, done.stdout


def copy_workspace(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "packages", tmp_path / "packages", ignore=shutil.ignore_patterns("tests")
    )
    return tmp_path


def test_import_to_the_right_is_reported_with_file_and_line(tmp_path):
    root = copy_workspace(tmp_path)
    offender = root / "packages/twinkle-mesh/src/twinkle/mesh/offender.py"
    offender.write_text('"""Bad."""\n\n\ndef f():\n    from twinkle.dataset import x\n')
    done = run_checker(root)
    assert done.returncode == 1
    assert "packages/twinkle-mesh/src/twinkle/mesh/offender.py:5" in done.stdout
    assert "twinkle.dataset (from twinkle-data)" in done.stdout


def test_client_importing_a_torch_package_is_reported(tmp_path):
    root = copy_workspace(tmp_path)
    offender = root / "packages/twinkle-client/src/twinkle_client/offender.py"
    offender.write_text("from twinkle import model\n")
    done = run_checker(root)
    assert done.returncode == 1
    assert (
        "offender.py:1: twinkle-client imports twinkle.model (from twinkle-models)" in done.stdout
    )


def test_declared_dependency_to_the_right_is_reported(tmp_path):
    root = copy_workspace(tmp_path)
    pyproject = root / "packages/twinkle-data/pyproject.toml"
    text = pyproject.read_text().replace('"twinkle-mesh",', '"twinkle-mesh",\n    "twinkle-rl",', 1)
    pyproject.write_text(text)
    done = run_checker(root)
    assert done.returncode == 1
    assert "twinkle-data must not depend on twinkle-rl" in done.stdout
