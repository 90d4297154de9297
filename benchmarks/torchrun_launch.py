"""Launch a benchmark script under torchrun on this machine and keep its table rows."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def table_rows(script: str, ranks: int, *args: str) -> list[str]:
    """``python -m torch.distributed.run --nproc_per_node=<ranks> script *args`` on a free
    port (one thread per rank unless OMP_NUM_THREADS says otherwise); the lines of its
    output that are Markdown table rows. Raises with the output's tail when a rank fails."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={ranks}",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        script,
        *args,
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return [line for line in done.stdout.splitlines() if line.startswith("|")]
