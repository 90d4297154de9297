"""INSTALL_CLIENT.sh (the installation page's `sh INSTALL_CLIENT.sh`): without conda it makes a
venv with the torch-free client from this checkout; with conda, a conda env named
twinkle-client (checked with a stand-in conda and --dry-run, since no conda is installed here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "INSTALL_CLIENT.sh"
LOCAL = f"{ROOT}/packages/twinkle-mesh {ROOT}/packages/twinkle-client"
FAKE_CONDA = """#!/bin/sh
echo "conda $*" >> "$CONDA_LOG"
if [ "$1 $2" = "env list" ]; then printf '# conda environments:\\nbase  /opt/conda\\n'; fi
"""


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", str(SCRIPT), *args],
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


def without_conda() -> dict[str, str]:
    """PATH without any folder that holds a conda."""
    folders = os.environ["PATH"].split(os.pathsep)
    return {"PATH": os.pathsep.join(f for f in folders if not (Path(f) / "conda").exists())}


def test_without_conda_it_makes_a_venv_with_the_torch_free_client(tmp_path):
    venv = tmp_path / "twinkle-client"
    done = run_script("--venv", str(venv), env=without_conda())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"Done. Activate it with: . {venv}/bin/activate" in done.stdout
    python = venv / "bin" / "python"
    probe = (
        "import importlib.util, twinkle_client; from twinkle_client import TwinkleClient; "
        "import twinkle_client.model; "  # the remote API table ships inside the wheel
        "print(twinkle_client.__file__); "
        "print([m for m in ('torch', 'transformers', 'peft') if importlib.util.find_spec(m)])"
    )
    checked = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    where, heavy = checked.stdout.splitlines()
    assert where.startswith(str(venv)) and heavy == "[]"  # installed, not the workspace's


@pytest.mark.parametrize(
    ("options", "install"),
    [
        ((), LOCAL),
        (("--with-tinker",), f"{LOCAL}[tinker]"),
        (("--from-pypi", "--with-tinker"), "twinkle-client[tinker]"),
    ],
)
def test_with_conda_it_makes_a_conda_env_named_twinkle_client(tmp_path, options, install):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "conda").write_text(FAKE_CONDA)
    (bin_dir / "conda").chmod(0o755)
    log = tmp_path / "conda.log"
    path = f"{bin_dir}{os.pathsep}{without_conda()['PATH']}"
    done = run_script(*options, "--dry-run", env={"PATH": path, "CONDA_LOG": str(log)})
    assert done.returncode == 0, done.stderr
    conda_python = "conda run --no-capture-output -n twinkle-client python"
    assert done.stdout.splitlines() == [
        "+ conda create -y -n twinkle-client python=3.11",
        f"+ {conda_python} -m pip install --upgrade pip",
        f"+ {conda_python} -m pip install {install}",
    ]
    assert log.read_text() == "conda env list\n"  # --dry-run: it only looked


def test_an_unknown_option_names_the_known_ones():
    done = run_script("--yes")
    assert done.returncode == 2
    assert "unknown option --yes (use --venv DIR, --with-tinker, --from-pypi" in done.stderr
