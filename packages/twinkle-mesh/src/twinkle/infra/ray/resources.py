"""What a DeviceGroup asks of a Ray cluster, and whether the cluster has it (pure; no Ray).

Each worker of a group is one placement-group bundle: ``gpus_per_worker``
devices of the group's kind plus one CPU for the process (a CPU group's
worker takes one CPU). The checks run at ``twinkle.initialize`` so that a
group the cluster cannot hold fails there, saying what is missing, rather than
leaving a placement group pending forever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from twinkle.mesh import DeviceGroup

RAY_RESOURCE = {"cuda": "GPU", "npu": "NPU", "cpu": "CPU", "mps": "CPU"}


def bundle_of(group: DeviceGroup) -> dict[str, float]:
    """The resources one worker of ``group`` reserves."""
    resource = RAY_RESOURCE[group.device_type]
    if resource == "CPU":
        return {"CPU": 1.0}
    return {resource: float(group.gpus_per_worker), "CPU": 1.0}


def _fmt(amount: float) -> str:
    return str(int(amount)) if float(amount).is_integer() else f"{amount:g}"


def check_groups_fit(
    groups: Sequence[DeviceGroup],
    total: Mapping[str, float],
    available: Mapping[str, float],
    nodes: Sequence[Mapping[str, float]],
    nproc_per_node: int | None,
) -> None:
    """Raise ValueError naming the first group the cluster cannot hold, and why.

    ``total`` and ``available`` are the cluster's resources (``ray.cluster_resources()``,
    ``ray.available_resources()``); ``nodes`` each alive node's resources. Groups are
    placed in order, so a later group sees what the earlier ones left.
    """
    free = {key: float(value) for key, value in available.items()}
    taken_by: dict[str, list[str]] = {}
    for group in groups:
        if group.visible_devices is not None:
            raise ValueError(
                f"DeviceGroup {group.name!r}: visible_devices is not used in ray mode, where "
                "Ray assigns each worker its devices; start the Ray node with the devices it "
                "may use instead (CUDA_VISIBLE_DEVICES=8,9 ray start ...)"
            )
        _check_rank_indices(group, total, nproc_per_node)
        bundle = bundle_of(group)
        _check_one_worker_fits(group, bundle, nodes)
        for resource, per_worker in bundle.items():
            need = per_worker * group.num_workers
            have = free.get(resource, 0.0)
            if need > have:
                earlier = taken_by.get(resource)
                after = f" after groups {earlier}" if earlier else ""
                raise ValueError(
                    f"group {group.name!r} needs {_fmt(need)} {resource} ({group.num_workers} "
                    f"worker(s) × {_fmt(per_worker)}), the cluster has {_fmt(have)} free{after} "
                    f"(of {_fmt(total.get(resource, 0.0))}); add nodes (ray start "
                    "--address=...) or give the group fewer ranks"
                )
            free[resource] = have - need
            taken_by.setdefault(resource, []).append(group.name)


def _check_rank_indices(
    group: DeviceGroup, total: Mapping[str, float], nproc_per_node: int | None
) -> None:
    if isinstance(group.ranks, int):
        return
    resource = RAY_RESOURCE[group.device_type]
    devices = int(total.get(resource, 0))
    highest = max(group.ranks)
    if highest >= devices:
        raise ValueError(
            f"group {group.name!r} lists device rank {highest}, but the cluster has {devices} "
            f"{resource} in all (ranks 0..{devices - 1}); list ranks within the cluster"
        )
    if nproc_per_node is not None and highest // nproc_per_node >= max(
        1, devices // nproc_per_node
    ):
        raise ValueError(
            f"group {group.name!r} lists device rank {highest}, which with nproc_per_node="
            f"{nproc_per_node} is on node {highest // nproc_per_node}, but the cluster's "
            f"{devices} {resource} make {devices // nproc_per_node} such node(s)"
        )


def _check_one_worker_fits(
    group: DeviceGroup, bundle: Mapping[str, float], nodes: Sequence[Mapping[str, float]]
) -> None:
    if any(all(node.get(k, 0.0) >= v for k, v in bundle.items()) for node in nodes):
        return
    wanted = ", ".join(f"{_fmt(v)} {k}" for k, v in bundle.items())
    largest = ", ".join(
        f"{_fmt(max((node.get(k, 0.0) for node in nodes), default=0.0))} {k}" for k in bundle
    )
    raise ValueError(
        f"a worker of group {group.name!r} needs {wanted} on one node, and no node has that "
        f"much (the largest offers {largest}); lower gpus_per_worker or add a larger node"
    )
