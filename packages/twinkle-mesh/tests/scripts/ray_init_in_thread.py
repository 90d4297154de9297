"""``twinkle.initialize('ray')`` from a thread that then ends (as the server's loader thread
does): the local cluster it started must outlive that thread. Prints ``zombies=<n>`` (Ray
processes of this driver already dead) and the result of a task scheduled afterwards."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import ray

import twinkle
from twinkle import DeviceGroup


def dead_children() -> int:
    """Children of this process that have exited (a killed GCS or raylet is one)."""
    dead = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] == "Z":
            dead += 1
    return dead


def main(temp_dir: str) -> None:
    kwargs = {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False}
    errors: list[BaseException] = []

    def load() -> None:
        try:
            twinkle.initialize(
                "ray",
                groups=[DeviceGroup(name="g", ranks=1, device_type="cpu")],
                ray_init_kwargs={**kwargs, "_temp_dir": temp_dir},
            )
        except BaseException as exc:
            errors.append(exc)

    loader = threading.Thread(target=load)
    loader.start()
    loader.join()
    if errors:
        raise errors[0]
    time.sleep(2)  # time for the kernel to kill what the ended thread started
    print(f"zombies={dead_children()}", flush=True)
    task = ray.remote(num_cpus=0)(lambda: 41 + 1).remote()
    print(f"task={ray.get(task, timeout=60)}", flush=True)
    os._exit(0)  # the test checked what it needs; skip Ray's teardown


if __name__ == "__main__":
    main(sys.argv[1])
