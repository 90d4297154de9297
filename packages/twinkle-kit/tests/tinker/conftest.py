"""One real twinkle-server process for every Tinker SDK test of the session.

The server runs as a process (``python -m twinkle.server launch``, started by the
``server_process`` fixture of tests/conftest.py) on 127.0.0.1 with the bundled tiny model and
the torch sampler, its state in a temporary TWINKLE_HOME, and two ``tml-`` keys made with the
CLI. The tests talk to it only through the unmodified ``tinker`` SDK (or plain HTTP), so what
passes here is what a Tinker user gets.

Fixtures:
    tinker_server  -> TinkerServer(base_url, key_a, key_b)  (a 3-tuple: unpack it)
    server_home    -> the server's TWINKLE_HOME (Path), for tests that look at files
    server_log     -> a callable returning the tail of the server's log (for assert messages)
    base_model     -> the model name the server serves (what create_lora_training_client takes)
    service        -> a tinker.ServiceClient with key_a, one per module (closed at its end)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import tinker

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


@pytest.fixture(scope="session")
def _running_server(server_process) -> Iterator[_Running]:
    process = server_process(
        "tinker_home",
        {
            "model": {"model_id": BASE_MODEL, "max_loras": 16, "device": "cpu"},
            # the tests' one main key holds every test's adapters (the default quota is half)
            "limits": {"max_loras_per_key": 16},
            "sampler": {"enabled": True, "kind": "torch"},
        },
    )
    key_a, key_b = (
        process.cli("keys", "create", "--name", name) for name in ("tinker-a", "tinker-b")
    )
    assert key_a.startswith("tml-") and key_b.startswith("tml-"), (key_a, key_b)
    process.start(timeout_s=START_TIMEOUT_S)
    yield _Running(TinkerServer(process.url, key_a, key_b), process.home, process.log)
    process.stop(timeout_s=30)


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


@pytest.fixture(scope="module")
def service(tinker_server: TinkerServer) -> Iterator[tinker.ServiceClient]:
    with tinker.ServiceClient(
        base_url=tinker_server.base_url, api_key=tinker_server.key_a
    ) as client:
        yield client
