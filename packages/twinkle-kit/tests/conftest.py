"""A real twinkle-server process for the end-to-end tests, started one way for all of them.

The server is always a process of its own (``python -m twinkle.server``, or a script such as
cookbook/server/server.py), never imported: what the tests see is what a user gets. The helper
lives here because pytest runs with ``--import-mode=importlib``, so a test module cannot import
a sibling by name; the ``server_process`` fixture hands it out.

Fixtures:
    server_process -> make(name, config=None, *, ray=False) -> ServerProcess (not started)
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

HOST = "127.0.0.1"


# Below Linux's ephemeral range (32768-60999) and above Ray's worker ports (10002-19999): a
# port the kernel handed out would be free only until one of Ray's processes, started
# between our check and the server's bind, was handed it too (seen: Serve's proxy failed to
# bind its port in test_ray_mode).
QUIET_PORTS = range(20000, 32768)


def _free_port() -> int:
    for port in random.sample(QUIET_PORTS, 200):
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {QUIET_PORTS} on {HOST}")


class ServerProcess:
    """One server: its TWINKLE_HOME, port, config file (if any), environment and process.

    ``cli`` runs ``python -m twinkle.server ...`` (with ``-c config`` when there is a config);
    ``start`` launches the server, or ``command``, and returns once /api/v1/healthz answers.
    """

    def __init__(
        self, home: Path, config: dict[str, Any] | None = None, *, ray: bool = False
    ) -> None:
        self.home = home
        self.port = _free_port()
        self.log = home / "server.log"
        self.config: Path | None = None
        if config is not None:
            self.config = home / "config.yaml"
            full = {"host": HOST, "port": self.port, **config, "storage": {"home": str(home)}}
            self.config.write_text(yaml.safe_dump(full, sort_keys=False))
        self.env = {
            **os.environ,
            "TWINKLE_HOME": str(home),
            "OMP_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "",  # let the child cache its imports
        }
        self.ray_dir: tempfile.TemporaryDirectory | None = None
        if ray:  # the server starts its own Ray cluster, whose socket paths must stay short
            self.ray_dir = tempfile.TemporaryDirectory(prefix="twr")
            self.env |= {"RAY_TMPDIR": self.ray_dir.name, "RAY_AUTH_MODE": "disabled"}
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def cli(self, *args: str) -> str:
        """Runs the server's CLI against this server's state; returns its stdout."""
        config = ["-c", str(self.config)] if self.config else []
        done = subprocess.run(
            [sys.executable, "-m", "twinkle.server", *args, *config],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def start(
        self, command: list[str] | None = None, *, timeout_s: float = 180, poll_s: float = 0.5
    ) -> None:
        """Launches the server (``twinkle.server launch -c config`` unless ``command`` is given)
        and waits until it is ready; on failure it stops it and shows the log's tail."""
        if command is None:
            assert self.config, "a server without a config needs the command that starts it"
            command = [sys.executable, "-m", "twinkle.server", "launch", "-c", str(self.config)]
        with open(self.log, "wb") as out:  # the child keeps its own handle
            self.proc = subprocess.Popen(
                command, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            self._wait_ready(timeout_s, poll_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float, poll_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc.poll() is None, "server exited:\n" + self.log_tail()
            assert time.monotonic() < deadline, "server not ready:\n" + self.log_tail()
            try:
                if httpx.get(f"{self.url}/api/v1/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(poll_s)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def stop(self, timeout_s: float = 30) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; a server already stopped is left be."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.ray_dir is not None:
            self.ray_dir.cleanup()
            self.ray_dir = None


@pytest.fixture(scope="session")
def server_process(tmp_path_factory) -> Iterator[Callable[..., ServerProcess]]:
    """Makes servers, each in a fresh home (``tmp_path_factory.mktemp(name)``); whatever a
    test's fixture did not stop is stopped at the end of the session."""
    made: list[ServerProcess] = []

    def make(name: str, config: dict[str, Any] | None = None, *, ray: bool = False):
        made.append(ServerProcess(tmp_path_factory.mktemp(name), config, ray=ray))
        return made[-1]

    yield make
    for server in made:
        server.stop()
