"""Run under torchrun: initialize local mode on a CPU mesh and report what each rank sees.

Usage: torchrun --nproc_per_node=2 torchrun_initialize.py OUT_DIR
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import twinkle
from twinkle import DeviceMesh, get_device_placement


def main(out_dir: Path) -> None:
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    twinkle.initialize("local", global_device_mesh=mesh)
    rank = dist.get_rank()
    share = mesh.get_slice(5)
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value, group=mesh.to_torch()["dp"].get_group())
    # An explicit rank array, reversed: rank 0 is the mesh's second position.
    reversed_mesh = DeviceMesh(mesh=[1, 0], mesh_dim_names=("dp",), device_type="cpu")
    reversed_share = reversed_mesh.get_slice(5)
    result = {
        "rank": rank,
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "global_mesh_is_ours": twinkle.infra.get_global_device_mesh() is mesh,
        "slice": [share.start, share.stop],
        "all_reduced": value.item(),
        "reversed_slice": [reversed_share.start, reversed_share.stop],
        "reversed_torch_coordinate": reversed_mesh.to_torch().get_coordinate(),
        "placement_marks_this_rank": f"\n{rank}* " in get_device_placement(),
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    # NOTE: gloo's teardown can abort a rank ("terminate called without an active
    # exception") when its peer closes the sockets first, even after a barrier. Once both
    # ranks have written their results the process has nothing left to do, so it leaves
    # without running the C++ destructors.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
