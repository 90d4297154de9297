"""The environment each worker of a group starts torch.distributed with (pure; no Ray).

Ray gives every worker its own devices. The ranks of one group on one node
see the union of those devices, in local-rank order, so that device index
``LOCAL_RANK`` (× ``gpus_per_worker``) is the worker's own, as under torchrun,
and NCCL/HCCL peers on a node can see each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from twinkle.mesh import Platform


@dataclass(frozen=True)
class WorkerInfo:
    """What a freshly started worker reports about itself."""

    node_id: str
    node_ip: str
    pid: int
    devices: tuple[str, ...]  # the accelerator ids Ray assigned (empty for a CPU worker)


def worker_envs(
    infos: Sequence[WorkerInfo], device_type: str, master_port: int
) -> list[dict[str, str]]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT and device visibility.

    Rank 0's node is the master. ``master_port`` is a port rank 0 found free.
    """
    by_node: dict[str, list[int]] = {}
    for rank, info in enumerate(infos):
        by_node.setdefault(info.node_id, []).append(rank)
    visible_var = Platform.visible_devices_env(device_type)
    envs = []
    for rank, info in enumerate(infos):
        peers = by_node[info.node_id]
        env = {
            "RANK": str(rank),
            "WORLD_SIZE": str(len(infos)),
            "LOCAL_RANK": str(peers.index(rank)),
            "LOCAL_WORLD_SIZE": str(len(peers)),
            "MASTER_ADDR": infos[0].node_ip,
            "MASTER_PORT": str(master_port),
        }
        if visible_var and info.devices:
            env[visible_var] = ",".join(d for peer in peers for d in infos[peer].devices)
        envs.append(env)
    return envs


def accelerator_ids(ids_by_resource: Mapping[str, Sequence[str]], device_type: str) -> tuple:
    """This worker's device ids from Ray's ``get_accelerator_ids()`` for the group's kind."""
    key = {"cuda": "GPU", "npu": "NPU"}.get(device_type)
    return tuple(str(i) for i in ids_by_resource.get(key, ())) if key else ()
