"""One real twinkle-server process for every Tinker SDK test of the session.

The server runs as a process (``python -m twinkle.server launch``) on 127.0.0.1 with the bundled
tiny model and the torch sampler, its state in a temporary TWINKLE_HOME, and two ``tml-`` keys
made with the CLI. The tests talk to it only through the unmodified ``tinker`` SDK (or plain
HTTP), so what passes here is what a Tinker user gets.

Fixtures:
    tinker_server  -> TinkerServer(base_url, key_a, key_b)  (a 3-tuple: unpack it)
    server_home    -> the server's TWINKLE_HOME (Path), for tests that look at files
    server_log     -> a callable returning the tail of the server's log (for assert messages)
    base_model     -> the model name the server serves (what create_lora_training_client takes)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

BASE_MODEL = "bundled://tiny-qwen3"
START_TIMEOUT_S = 240


class TinkerServer(NamedTuple):
    base_url: str
    key_a: str
    key_b: str


class _Running(NamedTuple):
    server: TinkerServer
    home: Path
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_config(home: Path, port: int) -> Path:
    config = home / "config.yaml"
    config.write_text(
        f"host: 127.0.0.1\nport: {port}\n"
        f"model: {{model_id: '{BASE_MODEL}', max_loras: 16, device: cpu}}\n"
        "sampler: {enabled: true, kind: torch}\n"
        f"storage: {{home: '{home}'}}\n"
    )
    return config


def _wait_ready(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert proc.poll() is None, "server exited:\n" + log.read_text()[-3000:]
        assert time.monotonic() < deadline, "server not ready:\n" + log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)


@pytest.fixture(scope="session")
def _running_server(tmp_path_factory) -> Iterator[_Running]:
    home = tmp_path_factory.mktemp("tinker_home")
    port = _free_port()
    config = _write_config(home, port)
    env = {
        **os.environ,
        "TWINKLE_HOME": str(home),
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "",
    }

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "twinkle.server", *args, "-c", str(config)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    key_a, key_b = (cli("keys", "create", "--name", name) for name in ("tinker-a", "tinker-b"))
    assert key_a.startswith("tml-") and key_b.startswith("tml-"), (key_a, key_b)
    log = home / "server.log"
    with open(log, "wb") as out:  # the child keeps its own handle
        proc = subprocess.Popen(
            [sys.executable, "-m", "twinkle.server", "launch", "-c", str(config)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, url, log)
        yield _Running(TinkerServer(url, key_a, key_b), home, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="session")
def tinker_server(_running_server: _Running) -> TinkerServer:
    """(base_url, key_a, key_b) of the running server; the keys belong to different tenants."""
    return _running_server.server


@pytest.fixture(scope="session")
def server_home(_running_server: _Running) -> Path:
    return _running_server.home


@pytest.fixture(scope="session")
def server_log(_running_server: _Running) -> Callable[[], str]:
    return lambda: _running_server.log.read_text(errors="replace")[-4000:]


@pytest.fixture(scope="session")
def base_model() -> str:
    return BASE_MODEL
