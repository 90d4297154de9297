"""A real server process killed with SIGKILL mid-training, then restarted.

After the restart the runs and every completed checkpoint are listed; every listed
checkpoint loads and gives back the saved weights; a save cut short by the kill is neither
listed nor left on disk.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "TWINKLE_HOME": str(home),
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "",
    }


def _cli(home: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "twinkle.server", *args],
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


class Server:
    def __init__(self, home: Path, config: Path, port: int) -> None:
        with open(home / "server.log", "ab") as log:  # the child keeps its own handle
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "twinkle.server", "launch", "-c", str(config)],
                env=_env(home),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{port}/api/v1"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (home / "server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError("the server did not become ready")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


class Api:
    def __init__(self, url: str, key: str) -> None:
        self.http = httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=120)
        self.session = self.http.post("/create_session", json={}).json()["session_id"]

    def new_run(self) -> str:
        body = {"session_id": self.session, "config": {"r": 4}}
        response = self.http.post("/twinkle/model/add_adapter_to_model", json=body)
        assert response.status_code == 200, response.text
        return response.json()["result"]["training_run_id"]

    def call(self, run: str, method: str, **args):
        body = {"training_run_id": run, "args": args}
        return self.http.post(f"/twinkle/model/{method}", json=body)

    def ok(self, run: str, method: str, **args):
        response = self.call(run, method, **args)
        assert response.status_code == 200, response.text
        return response.json()["result"]


def test_sigkill_mid_training_keeps_runs_and_complete_checkpoints(tmp_path):
    port = _free_port()
    config = tmp_path / "config.yaml"
    config.write_text(
        f"port: {port}\nmodel: {{model_id: 'bundled://tiny-qwen3', max_loras: 4, device: cpu}}\n"
        f"sampler: {{enabled: false}}\nstorage: {{home: '{tmp_path}'}}\n"
    )
    key = _cli(tmp_path, "keys", "create", "--name", "alice", "-c", str(config))

    server = Server(tmp_path, config, port)
    api = Api(server.url, key)
    run = api.new_run()
    api.ok(run, "set_optimizer", optimizer_cls="AdamW", lr=1e-2)
    for _ in range(2):
        api.ok(run, "forward_backward", inputs=[FEATURE])
        api.ok(run, "step")
        api.ok(run, "zero_grad")
    good = api.ok(run, "save", name="good")
    saved_loss = api.ok(run, "forward_only", inputs=[FEATURE])["loss"]

    # Keep training and saving while the server dies: some saves complete, one is cut short.
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            try:
                api.call(run, "forward_backward", inputs=[FEATURE])
                api.call(run, "step")
                api.call(run, "save", name=f"rolling-{i}")
            except httpx.TransportError:
                return
            i += 1

    worker = threading.Thread(target=churn)
    worker.start()
    time.sleep(3.0)
    server.kill()
    stop.set()
    worker.join(timeout=30)
    # What a save cut short leaves behind, whatever the kill's timing was.
    folder = tmp_path / "checkpoints"
    partial = next(folder.glob("*/*/weights")) / ".cut-short.tmp-abc123"
    partial.mkdir()
    (partial / "adapter_model.safetensors").write_bytes(b"\0" * 100)

    server = Server(tmp_path, config, port)
    api = Api(server.url, key)
    runs = api.http.get("/training_runs").json()["training_runs"]
    assert [r["training_run_id"] for r in runs] == [run]
    assert runs[0]["active"] is False
    listed = api.http.get(f"/training_runs/{run}/checkpoints").json()["checkpoints"]
    names = [c["checkpoint_id"] for c in listed]
    assert "weights/good" in names
    assert all(n == "weights/good" or n.startswith("weights/rolling-") for n in names)
    assert not partial.exists()
    assert not list(folder.rglob(".*.tmp-*"))
    # The old run holds no slot; a new one loads each listed checkpoint.
    assert api.call(run, "step").status_code == 409
    fresh = api.new_run()
    api.ok(fresh, "set_optimizer", optimizer_cls="AdamW", lr=1e-2)
    for checkpoint in listed:
        api.ok(fresh, "load", path=checkpoint["twinkle_path"], load_optimizer=True)
    api.ok(fresh, "load", path=good, load_optimizer=True)
    assert api.ok(fresh, "forward_only", inputs=[FEATURE])["loss"] == pytest.approx(
        saved_loss, abs=1e-6
    )
    server.kill()
