"""A real server process keeps the client's connection open after every refused request and
after a genuine server fault: the next normal request travels on the same connection.

Starlette's last-resort handler answers an unexpected exception and then re-raises it, and
uvicorn closes the connection of a request whose app raised; the server answers every
exception itself (``twinkle.server.app.ErrorAnswers``), so a 500 no longer drops it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from twinkle.server.checkpoint_recovery import run_folder_name

FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "TWINKLE_HOME": str(home), "OMP_NUM_THREADS": "1"}


def _start(home: Path, config: Path) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "twinkle.server", "keys", "create", "--name", "alice"]
    made = subprocess.run(
        [*command, "-c", str(config)], env=_env(home), capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stderr
    with open(home / "server.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "twinkle.server", "launch", "-c", str(config)],
            env=_env(home),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return proc, made.stdout.strip()


def _wait_ready(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the server did not become ready")


def _local_port(response: httpx.Response) -> int:
    """The client side's port of the connection that carried ``response``."""
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]


def test_refusals_and_a_server_fault_leave_the_connection_open(tmp_path):
    port = _free_port()
    config = tmp_path / "config.yaml"
    config.write_text(
        f"port: {port}\nmodel: {{model_id: 'bundled://tiny-qwen3', max_loras: 2, device: cpu}}\n"
        f"sampler: {{enabled: false}}\nstorage: {{home: '{tmp_path}'}}\n"
        "limits: {max_body_bytes: 65536}\n"
    )
    proc, key = _start(tmp_path, config)
    url = f"http://127.0.0.1:{port}/api/v1"
    try:
        _wait_ready(proc, url, tmp_path / "server.log")
        http = httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=120)
        session = http.post("/create_session", json={}).json()["session_id"]
        added = http.post(
            "/twinkle/model/add_adapter_to_model",
            json={"session_id": session, "config": {"r": 4}},
        )
        run = added.json()["result"]["training_run_id"]
        port_in_use = _local_port(added)

        def call(method: str, **args) -> httpx.Response:
            body = {"training_run_id": run, "args": args}
            return http.post(f"/twinkle/model/{method}", json=body)

        saved = call("save", name="a")
        assert saved.status_code == 200, saved.text
        # A server fault: the folder a sampler checkpoint goes into is a file on disk.
        (
            next((tmp_path / "checkpoints").glob(f"*/{run_folder_name(run)}")) / "sampler_weights"
        ).write_text("")
        json_headers = {"Content-Type": "application/json"}
        refused = [
            (400, lambda: call("set_optimizer", optimizer_cls="AdamW", lr=-1.0)),
            (
                400,
                lambda: http.post(
                    "/twinkle/model/set_optimizer",
                    content=f'{{"training_run_id": "{run}", "args": {{"lr": Infinity}}}}',
                    headers=json_headers,
                ),
            ),
            (400, lambda: call("forward_backward", inputs=[{"input_ids": [1, 10**6]}])),
            (
                413,
                lambda: http.post("/forward_backward", content="[" * 60_000, headers=json_headers),
            ),
            (413, lambda: http.post("/create_session", content=b"{" + b" " * 70_000 + b"}")),
            (500, lambda: call("save", name="b", kind="sampler_weights")),
        ]
        for status, send in refused:
            response = send()
            assert response.status_code == status, response.text
            if status == 500:
                body = response.json()
                assert body.pop("request_id") == response.headers["x-request-id"]
                assert body == {
                    "error": "internal server error",
                    "category": "server",
                    "code": "internal",
                }
            normal = call("forward_only", inputs=[FEATURE])
            assert normal.status_code == 200, normal.text
            assert _local_port(normal) == port_in_use, f"the connection was dropped after {status}"
        log = (tmp_path / "server.log").read_text()
        assert "FileExistsError" in log  # the fault is in the server's log, not in the answer
    finally:
        proc.kill()
        proc.wait(timeout=30)
