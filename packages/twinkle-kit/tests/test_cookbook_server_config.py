"""The server config the documents pass to ``twinkle-server launch -c``
(cookbook/client/server/transformer/server_config.yaml): the server's loader accepts it, and
the documents' command starts a server from it that answers a client's key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from twinkle.server.config import check_allow_lists, load_config

CONFIG = (
    Path(__file__).resolve().parents[3]
    / "cookbook"
    / "client"
    / "server"
    / "transformer"
    / "server_config.yaml"
)
TWINKLE_SERVER = Path(sys.executable).parent / "twinkle-server"  # the console script


def test_the_documents_config_passes_the_servers_loader_and_checks():
    config = load_config(CONFIG)
    assert config.model.model_id == "bundled://tiny-qwen3" and config.model.device == "cpu"
    assert config.sampler.enabled and config.model.max_loras == 4
    assert check_allow_lists(config) == []


def test_twinkle_server_launch_c_starts_the_cookbook_server(server_process):
    server = server_process("cookbook-config")
    run = [str(TWINKLE_SERVER)]

    def cli(*args: str) -> str:
        done = subprocess.run(
            [*run, *args, "-c", str(CONFIG)],
            env=server.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert "config ok: bundled://tiny-qwen3" in cli("check-config")
    key = cli("keys", "create", "--name", "me")
    # The documents' command; only the port differs, so that tests never collide on 8000.
    server.start([*run, "launch", "-c", str(CONFIG), "--port", str(server.port)])
    try:
        headers = {"X-API-Key": key}
        runs = httpx.get(f"{server.url}/api/v1/training_runs", headers=headers, timeout=30)
        assert runs.status_code == 200, runs.text
        refused = httpx.get(f"{server.url}/api/v1/training_runs", timeout=30)
        assert refused.status_code == 401
    finally:
        server.stop(timeout_s=30)
