"""A real server process killed with SIGKILL mid-training, then restarted.

After the restart the runs and every completed checkpoint are listed; every listed
checkpoint loads and gives back the saved weights; a save cut short by the kill is neither
listed nor left on disk. Kills landed in each window of a save (by the pause hook of
``twinkle.model.checkpoint_recovery``) leave the checkpoint recorded, or the previous one
back in place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "TWINKLE_HOME": str(home),
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "",
        **extra,
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
    def __init__(self, home: Path, config: Path, port: int, **env: str) -> None:
        self.log = home / "server.log"
        with open(self.log, "ab") as log:  # the child keeps its own handle
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "twinkle.server", "launch", "-c", str(config)],
                env=_env(home, **env),
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

    def kill_when_paused(self, point: str, request: Callable[[], object]) -> None:
        """Send ``request`` (a save), wait until the server stops at the pause ``point``,
        then SIGKILL it there."""
        sent = threading.Thread(target=lambda: _ignore_disconnect(request))
        start = self.log.stat().st_size
        sent.start()
        deadline = time.monotonic() + 120
        while f"TWINKLE_PAUSED {point} ".encode() not in self.log.read_bytes()[start:]:
            assert time.monotonic() < deadline and self.proc.poll() is None, "never paused"
            time.sleep(0.2)
        self.kill()
        sent.join(timeout=30)


def _ignore_disconnect(request: Callable[[], object]) -> None:
    with contextlib.suppress(httpx.TransportError):  # the server was killed meanwhile
        request()


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


def test_a_kill_in_each_window_of_a_save_loses_nothing(tmp_path):
    """Windows: an overwrite between its renames (rolled back at start-up), and a save done
    but not yet recorded (recorded at start-up). Folders no run can reach are collected."""
    port = _free_port()
    config = tmp_path / "config.yaml"
    config.write_text(
        f"port: {port}\nmodel: {{model_id: 'bundled://tiny-qwen3', max_loras: 4, device: cpu}}\n"
        f"sampler: {{enabled: false}}\nstorage: {{home: '{tmp_path}'}}\n"
    )
    key = _cli(tmp_path, "keys", "create", "--name", "alice", "-c", str(config))
    folder = tmp_path / "checkpoints"

    def train_and_measure(api: Api, run: str) -> float:
        api.ok(run, "forward_backward", inputs=[FEATURE])
        api.ok(run, "step")
        return api.ok(run, "forward_only", inputs=[FEATURE])["loss"]

    server = Server(tmp_path, config, port, TWINKLE_CHECKPOINT_PAUSE_AT="aside:good")
    api = Api(server.url, key)
    run = api.new_run()
    api.ok(run, "set_optimizer", optimizer_cls="AdamW", lr=1e-2)
    good_loss = train_and_measure(api, run)
    good = api.ok(run, "save", name="good")
    assert train_and_measure(api, run) != good_loss
    server.kill_when_paused("aside", lambda: api.call(run, "save", name="good"))
    weights = next(folder.glob("*/*/weights"))
    assert not (weights / "good").exists() and list(weights.glob(".good.old-*"))

    server = Server(tmp_path, config, port, TWINKLE_CHECKPOINT_PAUSE_AT="unrecorded:pending")
    api = Api(server.url, key)
    listed = api.http.get(f"/training_runs/{run}/checkpoints").json()["checkpoints"]
    assert [c["checkpoint_id"] for c in listed] == ["weights/good"]
    second = api.new_run()
    api.ok(second, "set_optimizer", optimizer_cls="AdamW", lr=1e-2)
    api.ok(second, "load", path=good, load_optimizer=True)
    assert api.ok(second, "forward_only", inputs=[FEATURE])["loss"] == good_loss
    pending_loss = train_and_measure(api, second)
    server.kill_when_paused("unrecorded", lambda: api.call(second, "save", name="pending"))
    # Folders no tenant can reach: a run the store never had, a folder that is no checkpoint.
    stray_run = weights.parent.parent / "sess-gone_train_0"
    shutil.copytree(weights / "good", stray_run / "weights" / "copy")
    (weights / "junk").mkdir()
    (weights / "junk" / "adapter_model.safetensors").write_bytes(b"\0" * 10)

    server = Server(tmp_path, config, port)
    api = Api(server.url, key)
    listed = api.http.get(f"/training_runs/{second}/checkpoints").json()["checkpoints"]
    assert [c["checkpoint_id"] for c in listed] == ["weights/pending"]
    assert not stray_run.exists() and not (weights / "junk").exists()
    assert not list(folder.rglob(".*.tmp-*")) and not list(folder.rglob(".*.old-*"))
    third = api.new_run()
    api.ok(third, "set_optimizer", optimizer_cls="AdamW", lr=1e-2)
    api.ok(third, "load", path=listed[0]["twinkle_path"], load_optimizer=True)
    assert api.ok(third, "forward_only", inputs=[FEATURE])["loss"] == pending_loss
    api.ok(third, "load", path=good, load_optimizer=True)
    assert api.ok(third, "forward_only", inputs=[FEATURE])["loss"] == good_loss
    deleted = api.http.delete(f"/training_runs/{second}/checkpoints/weights/pending")
    assert deleted.status_code == 200, deleted.text
    assert api.http.get(f"/training_runs/{second}/checkpoints").json()["checkpoints"] == []
    assert not any(folder.glob("*/*/weights/pending"))
    server.kill()
