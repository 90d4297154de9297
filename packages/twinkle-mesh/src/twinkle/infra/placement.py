"""``get_device_placement``: a readable picture of where components and ranks live."""

from __future__ import annotations

import sys

from twinkle.infra.state import get_device_groups, get_global_device_mesh, get_mode
from twinkle.mesh import DeviceMesh, Platform


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [headers, *rows]
    ]


def _mesh_lines(mesh: DeviceMesh, this_rank: int) -> list[str]:
    dims = list(mesh.dim_names())
    sizes = " × ".join(f"{d}={mesh.size(d)}" for d in dims)
    rows = []
    for rank in range(mesh.world_size):
        coords = mesh.coords(rank)
        marker = "*" if rank == this_rank else ""
        rows.append(
            [f"{rank}{marker}", *(str(coords[d]) for d in dims), str(mesh.data_rank_of(rank))]
        )
    return [
        f"Global mesh: {sizes} on {mesh.device_type} "
        f"(world size {mesh.world_size}, data world size {mesh.data_world_size}; * = this process)",
        *_table(["rank", *dims, "data_rank"], rows),
    ]


def get_device_placement() -> str:
    """A table of the device groups, and of the global mesh: each rank's coordinates and data rank.

    Works before ``twinkle.initialize`` (then it describes this process alone).
    """
    mesh = get_global_device_mesh()
    rank, world_size = Platform.get_rank(), Platform.get_world_size()
    device_type = mesh.device_type if mesh else Platform.detect_device_type()
    device = device_type if device_type == "cpu" else f"{device_type}:{Platform.get_local_rank()}"
    lines = [
        f"Twinkle device placement (mode: {get_mode()})",
        f"This process: rank {rank} of {world_size}, device {device}",
        "",
    ]
    groups = get_device_groups()
    if groups:
        rows = [
            [
                g.name,
                g.device_type,
                f"any {g.ranks}" if isinstance(g.ranks, int) else str(g.ranks),
                str(g.num_workers),
                str(g.gpus_per_worker),
                g.visible_devices or "-",
            ]
            for g in groups
        ]
        headers = ["name", "device", "ranks", "workers", "devices/worker", "visible"]
        lines += ["Device groups:", *_table(headers, rows)]
    else:
        lines.append("Device groups: none")
    runtime = sys.modules.get("twinkle.infra.ray.runtime")  # loaded only in ray mode
    if runtime is not None and get_mode() == "ray":
        lines += runtime.describe(_table)
    lines.append("")
    if mesh is None:
        if get_mode() == "ray":
            lines.append("Global mesh: not given (each group's workers use dp over the group)")
        else:
            lines.append("Global mesh: not set (twinkle.initialize has not been called)")
    else:
        lines += _mesh_lines(mesh, rank)
    return "\n".join(lines)
