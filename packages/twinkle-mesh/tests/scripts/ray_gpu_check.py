"""GPU check of ray mode, for a machine with at least two GPUs (not run in CI).

    python packages/twinkle-mesh/tests/scripts/ray_gpu_check.py

Starts a local Ray instance, reserves a 'model' group of two GPU workers and checks
what the CPU tests can only check up to the device: Ray gives each worker its own GPU,
the workers of a node see their GPUs in local-rank order (so ``cuda:LOCAL_RANK`` is the
worker's own), and NCCL all-reduces over the group's process group. It also checks
that a group asking for more GPUs than the machine has fails at ``initialize``.
Prints one JSON line and exits 0 when every check holds.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).parent))

import ray  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import twinkle  # noqa: E402
from twinkle import DeviceGroup, remote_class, remote_function  # noqa: E402


@remote_class(execute="all")
class Probe:
    @remote_function(dispatch="all", collect="none", lazy_collect=False)
    def report(self) -> dict:
        local_rank = int(os.environ["LOCAL_RANK"])
        device = torch.device("cuda", local_rank)
        value = torch.ones(1, device=device) * (dist.get_rank() + 1)
        dist.all_reduce(value)
        return {
            "rank": dist.get_rank(),
            "backend": dist.get_backend(),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ray_gpu_ids": [str(i) for i in ray.get_gpu_ids()],
            "device": str(device),
            "uuid": str(torch.cuda.get_device_properties(device).uuid),
            "all_reduced": value.item(),
        }


def main() -> int:
    gpus = torch.cuda.device_count()
    if gpus < 2:
        print(json.dumps({"error": f"needs 2 GPUs, found {gpus}"}))
        return 1
    ray.init(num_gpus=gpus, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="ray-"))
    too_many = [DeviceGroup(name="model", ranks=gpus + 1, device_type="cuda")]
    try:
        twinkle.initialize("ray", groups=too_many)
        refused = False
    except ValueError as exc:
        refused = f"needs {gpus + 1} GPU" in str(exc)
    twinkle.initialize("ray", groups=[DeviceGroup(name="model", ranks=2, device_type="cuda")])
    reports = Probe(remote_group="model").report()
    checks = {
        "too_many_refused": refused,
        "nccl": all(r["backend"] == "nccl" for r in reports),
        "all_reduce": [r["all_reduced"] for r in reports] == [3.0, 3.0],
        "own_gpu_each": len({r["uuid"] for r in reports}) == 2,
        "own_gpu_is_local_rank": all(
            r["visible"].split(",")[int(r["device"].split(":")[1])] == r["ray_gpu_ids"][0]
            for r in reports
        ),
    }
    print(json.dumps({"checks": checks, "reports": reports}))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
