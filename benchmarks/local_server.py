"""A twinkle-server process on 127.0.0.1 for the benchmarks: tiny model on CPU, a sampler
only when asked for.

Keys are created in the store before the server starts (as ``twinkle-server keys create``
does), so a benchmark has them without a CLI round trip.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from twinkle.server.auth import create_key
from twinkle.server.store import SQLiteStore


class LocalServer:
    def __init__(
        self,
        home: Path,
        key_names: list[str],
        max_loras: int,
        sampler_max_tokens: int = 0,
        batching: bool = True,
    ) -> None:
        """``sampler_max_tokens`` > 0 enables a TorchSampler with that completion limit;
        ``batching=False`` runs every request alone (no shared passes across tenants)."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        sampler = (
            f"{{enabled: true, kind: torch, max_tokens: {sampler_max_tokens}}}"
            if sampler_max_tokens
            else "{enabled: false}"
        )
        config = home / "config.yaml"
        config.write_text(
            f"port: {port}\nmodel: {{model_id: 'bundled://tiny-qwen3', max_loras: {max_loras},"
            f" device: cpu, batching: {{enabled: {str(batching).lower()}}}}}\n"
            f"sampler: {sampler}\nstorage: {{home: '{home}'}}\n"
        )
        store = SQLiteStore(home / "state.db")
        self.keys = [create_key(store, name)[0] for name in key_names]
        store.close()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": ""}
        self.log = home / "server.log"
        with open(self.log, "wb") as log:  # the child keeps its own handle
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "twinkle.server", "launch", "-c", str(config)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/api/v1/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.5)
        self.stop()
        raise TimeoutError("server did not start: " + self.log.read_text()[-2000:])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
