"""FSDP2 for the sharded experts: over ``ep_fsdp`` (HSDP across the EP blocks), not the dense mesh.

The ranks holding the same experts (equal ep coordinate) form the expert data-parallel
group. With ``ep_fsdp_size`` the experts are sharded over ``ep_fsdp`` and replicated
across the blocks of ``ep × ep_fsdp`` ranks; without it they are sharded over the whole
group. Each experts module becomes its own FSDP unit before the dense FSDP runs, so the
dense sharding leaves its parameters alone.

Gradient scale: the dense FSDP averages over all ``G = dp × fsdp`` ranks and the model
wrapper then multiplies every gradient by ``G / global tokens``. An expert gradient is
the sum over its group of partial sums (each already covering the tokens of a whole EP
group), so its reduction must divide by ``G`` too, not by the group's size ``S``. FSDP
divides by ``S``; the experts' forward scales their weights' gradients by ``S / G``
before it (``gradient_scale``; gloo has no pre-multiplied reduce for FSDP's own
divide-factor setting).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh as TorchMesh
from torch.distributed.fsdp import fully_shard

from twinkle.mesh import DeviceMesh


def expert_shard_mesh(device_mesh: DeviceMesh) -> TorchMesh:
    """The torch mesh the experts are sharded on: (ep_replicate, ep_fsdp) or (ep_fsdp,), among
    the ranks with this rank's tp coordinate (tp peers run the same experts on the same
    tokens, each holding them whole)."""
    ep, data = device_mesh.size("ep"), device_mesh.size("dp") * device_mesh.size("fsdp")
    tp = device_mesh.size("tp")
    if data * tp != device_mesh.world_size:
        raise NotImplementedError(
            "FSDP of experts over ep_fsdp covers meshes of dp, fsdp and tp only; this mesh also "
            f"has {[d for d in device_mesh.mesh_dim_names if d not in ('dp', 'fsdp', 'tp')]}"
        )
    shards = device_mesh.ep_fsdp_size or data // ep
    replicas = data // (ep * shards)
    # Rank d of the data ranks has ep coordinate d % ep and ep_fsdp coordinate
    # (d // ep) % shards (DeviceMesh); place every rank by its coordinates.
    layout = torch.empty(ep, tp, replicas, shards, dtype=torch.long)
    for rank in range(device_mesh.world_size):
        c = device_mesh.coords(rank)
        d = c.get("dp", 0) * device_mesh.size("fsdp") + c.get("fsdp", 0)
        layout[d % ep, c.get("tp", 0), d // (ep * shards), (d // ep) % shards] = rank
    names = ("ep", "tp", "ep_replicate", "ep_fsdp")
    mesh = TorchMesh(device_mesh.device_type, layout, mesh_dim_names=names)
    return mesh["ep_replicate", "ep_fsdp"] if replicas > 1 else mesh["ep_fsdp"]


def shard_experts_fsdp(experts: list[nn.Module], device_mesh: DeviceMesh) -> None:
    """Make each (already EP-sharded) experts module an FSDP unit on the expert mesh."""
    mesh = expert_shard_mesh(device_mesh)
    dense_ranks = device_mesh.size("dp") * device_mesh.size("fsdp")
    for module in experts:
        fully_shard(module, mesh=mesh)
        module.gradient_scale = mesh.size() / dense_ranks
