"""Fixtures shared by twinkle-models' tests: scripts run in child processes under torchrun.

Tests import with ``--import-mode=importlib``, so these helpers reach test files as
fixtures (``torchrun``, ``child_env``) rather than as imports.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

# Variables an outer torchrun would leave behind; the child launcher sets its own.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(**extra: str) -> dict[str, str]:
    """This environment for a child: one thread per process (2 cores are shared), imports'
    bytecode cached, no launcher variables inherited; ``extra`` added."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "", **extra}
    for name in LAUNCHER_VARIABLES:
        env.pop(name, None)
    return env


def run_torchrun(
    script: str | os.PathLike,
    *args: str | os.PathLike,
    procs: int = 2,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc_per_node=<procs> script *args`` on a free
    port; fails the test with the output's tail unless every process exits 0."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={procs}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(Path(script)),
        *map(str, args),
    ]
    done = subprocess.run(
        command,
        env=subprocess_env(**(env or {})),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


@pytest.fixture(scope="session")
def torchrun() -> Callable[..., subprocess.CompletedProcess]:
    """``torchrun(script, *args, procs=2, env=None, cwd=None, timeout=300)``: see run_torchrun."""
    return run_torchrun


@pytest.fixture(scope="session")
def child_env() -> Callable[..., dict[str, str]]:
    """``child_env(**extra)``: the environment of a child process (see subprocess_env)."""
    return subprocess_env


@pytest.fixture(scope="module")
def launch_per_size(tmp_path_factory) -> Callable[..., Callable[[str], Path]]:
    """``launch_per_size(script, processes, timeout=900)`` gives ``folder_of(case)``: the
    folder where one torchrun launch, of ``processes[case]`` ranks, wrote the results of
    ``script OUT case ...`` for every case of that size. Cases share a launch because its
    imports cost about as much as a case; a failed launch fails its first case's test and
    names it in the others."""

    def launcher(
        script: Path, processes: dict[str, int], timeout: float = 900
    ) -> Callable[[str], Path]:
        folders: dict[int, Path | None] = {}

        def folder_of(case: str) -> Path:
            procs = processes[case]
            if procs not in folders:
                folders[procs] = None
                out = tmp_path_factory.mktemp(f"{Path(script).stem}{procs}")
                cases = [c for c, n in processes.items() if n == procs]
                run_torchrun(script, out, *cases, procs=procs, timeout=timeout)
                folders[procs] = out
            if folders[procs] is None:
                pytest.fail(f"the {procs}-process launch of {Path(script).name} failed earlier")
            return folders[procs]

        return folder_of

    return launcher
