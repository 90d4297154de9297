"""``twinkle.initialize``: the one line of a training script that names the run mode."""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

from twinkle.infra.state import MODES, set_state
from twinkle.mesh import DeviceGroup, DeviceMesh, Platform, validate_device_groups
from twinkle.utils import get_logger

logger = get_logger(__name__)


def initialize(
    mode: str = "local",
    *,
    nproc_per_node: int | None = None,
    groups: Iterable[DeviceGroup] | None = None,
    global_device_mesh: DeviceMesh | None = None,
    lazy_collect: bool = True,
    seed: int | None = None,
    **kwargs: Any,
) -> None:
    """Set up the run mode for this process.

    ``'local'`` runs every component in process. Under torchrun (WORLD_SIZE >
    1) it starts torch.distributed with the backend that fits the mesh's
    device (gloo for cpu) unless it is already started; run alone, it starts
    nothing and only records the mesh. Either way the global mesh must have
    exactly one rank per process, so a mesh of 8 run with plain ``python``
    fails at once rather than training on an eighth of the data. Without
    ``global_device_mesh`` the mesh is data parallel over all processes, on
    the best device found. ``groups`` are checked in every mode
    (unique names, no device claimed twice). ``lazy_collect`` is the default for
    ``@remote_function(lazy_collect=None)``. ``seed`` seeds Python's random,
    numpy and torch (when installed) with the same value on every rank.

    ``'ray'`` attaches this driver to a Ray cluster, or starts a local one (see
    ``twinkle.infra.ray.runtime``), checks that the cluster can hold every group
    (a clear error names the group and what is missing) and reserves a placement
    group per DeviceGroup. Components built with ``remote_group=`` then live on
    the group's workers; without it they run here. Options: ``address`` (a Ray
    address; default: the running cluster, else a new local one) and
    ``ray_init_kwargs`` (passed to ``ray.init`` when this process starts Ray,
    e.g. ``{'num_cpus': 4, 'include_dashboard': False}``). ``global_device_mesh``
    is the mesh of a group with as many workers as it has ranks; other groups
    get data parallel over their workers. Calling ``initialize`` again stops the
    previous groups' workers.

    ``'http'`` is the server side of the HTTP service: it attaches to Ray like ``'ray'``
    (same ``address`` and ``ray_init_kwargs``) and checks that the cluster can hold every
    group, but reserves nothing: ``twinkle.server.launch()`` (twinkle-server) then reads
    the recorded mode and groups and deploys the service on Ray Serve, whose ingress builds
    the model and sampler on their groups (data parallel over each group's workers, so no
    ``global_device_mesh``). Components built in this process stay local.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {', '.join(map(repr, MODES))}")
    device_groups = validate_device_groups(groups or [])
    _check_arguments(nproc_per_node, global_device_mesh, lazy_collect, seed)
    if "twinkle.infra.ray.runtime" in sys.modules:  # leave no workers of an earlier run behind
        sys.modules["twinkle.infra.ray.runtime"].shutdown()
    if mode in ("ray", "http"):
        start = _start_ray if mode == "ray" else _attach_ray_for_http
        start(device_groups, nproc_per_node, global_device_mesh, lazy_collect, kwargs)
        if seed is not None:
            _seed_everything(seed)
        set_state(
            mode=mode,
            device_groups=device_groups,
            global_device_mesh=global_device_mesh,
            lazy_collect=lazy_collect,
        )
        return
    if kwargs:
        raise TypeError(
            f"initialize('local') got unexpected options {sorted(kwargs)}; local mode takes "
            "nproc_per_node, groups, global_device_mesh, lazy_collect and seed"
        )
    mesh = _start_local(global_device_mesh, nproc_per_node)
    if seed is not None:
        _seed_everything(seed)
    set_state(
        mode=mode, device_groups=device_groups, global_device_mesh=mesh, lazy_collect=lazy_collect
    )


def _check_ray_options(mode: str, options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - {"address", "ray_init_kwargs"})
    if unknown:
        raise TypeError(
            f"initialize({mode!r}) got unexpected options {unknown}; {mode} mode takes "
            "nproc_per_node, groups, global_device_mesh, lazy_collect, seed, address and "
            "ray_init_kwargs"
        )
    if importlib.util.find_spec("ray") is None:
        raise ImportError(f"{mode} mode needs Ray: pip install 'twinkle-mesh[ray]'")


def _start_ray(
    groups: list[DeviceGroup],
    nproc_per_node: int | None,
    mesh: DeviceMesh | None,
    lazy_collect: bool,
    options: dict[str, Any],
) -> None:
    _check_ray_options("ray", options)
    from twinkle.infra.ray import runtime  # here: Ray is an optional extra

    runtime.start(
        groups,
        nproc_per_node=nproc_per_node,
        global_device_mesh=mesh,
        lazy_collect=lazy_collect,
        **options,
    )


def _attach_ray_for_http(
    groups: list[DeviceGroup],
    nproc_per_node: int | None,
    mesh: DeviceMesh | None,
    lazy_collect: bool,
    options: dict[str, Any],
) -> None:
    """Join (or start) the cluster and fail now if a group cannot fit; the server's ingress
    reserves the groups when it starts, so a bad group never gets as far as a deployment."""
    _check_ray_options("http", options)
    if mesh is not None:
        raise ValueError(
            "initialize('http') takes no global_device_mesh: the server gives each component "
            "data parallel over its group's workers; size the groups instead"
        )
    import ray

    from twinkle.infra.ray.resources import check_groups_fit  # ray mode's, imported with Ray

    if not ray.is_initialized():
        ray.init(address=options.get("address"), **(options.get("ray_init_kwargs") or {}))
    elif options.get("address") is not None or options.get("ray_init_kwargs"):
        logger.warning(
            "this process already joined a Ray cluster, so address and ray_init_kwargs are "
            "not used; call ray.shutdown() first to join another"
        )
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    check_groups_fit(
        groups, ray.cluster_resources(), ray.available_resources(), nodes, nproc_per_node
    )


def _check_arguments(
    nproc_per_node: object, global_device_mesh: object, lazy_collect: object, seed: object
) -> None:
    if nproc_per_node is not None and (
        isinstance(nproc_per_node, bool)
        or not isinstance(nproc_per_node, int)
        or nproc_per_node < 1
    ):
        raise ValueError(f"nproc_per_node must be a positive integer, got {nproc_per_node!r}")
    if global_device_mesh is not None and not isinstance(global_device_mesh, DeviceMesh):
        raise TypeError(
            "global_device_mesh must be a DeviceMesh (e.g. DeviceMesh.from_sizes(dp_size=2)), "
            f"got {type(global_device_mesh).__name__}"
        )
    if not isinstance(lazy_collect, bool):
        raise TypeError(f"lazy_collect must be True or False, got {lazy_collect!r}")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32
    ):
        raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")


def _start_local(mesh: DeviceMesh | None, nproc_per_node: int | None) -> DeviceMesh:
    """Check the mesh against the processes torchrun started; start torch.distributed if needed."""
    world_size = Platform.get_world_size()
    local_world = os.environ.get("LOCAL_WORLD_SIZE")
    if nproc_per_node is not None and local_world and int(local_world) != nproc_per_node:
        raise ValueError(
            f"nproc_per_node={nproc_per_node} but the launcher started {local_world} processes "
            "on this node (LOCAL_WORLD_SIZE)"
        )
    if mesh is None:
        mesh = DeviceMesh.from_sizes(dp_size=world_size, device_type=Platform.detect_device_type())
    if mesh.world_size != world_size:
        sizes = " × ".join(
            f"{n}={s}" for n, s in zip(mesh.mesh_dim_names, mesh.mesh_shape, strict=True)
        )
        raise ValueError(
            f"global_device_mesh has world_size {mesh.world_size} ({sizes}) but this run has "
            f"{world_size} process(es); launch with torchrun --nproc_per_node={mesh.world_size} "
            "or change the mesh sizes"
        )
    if world_size > 1:
        _init_process_group(mesh.device_type)
    return mesh


def _init_process_group(device_type: str) -> None:
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if device_type in ("cuda", "npu"):
        accelerator = getattr(torch, device_type, None)
        if accelerator is None or not accelerator.is_available():
            raise RuntimeError(
                f"the global mesh uses device_type={device_type!r} but no {device_type} device "
                "is available; build it with DeviceMesh.from_sizes(..., device_type='cpu')"
            )
        # NOTE: pick this process's device before the process group exists, so that
        # NCCL/HCCL binds each rank to its own device rather than all to device 0.
        accelerator.set_device(Platform.get_local_rank())
    dist.init_process_group(backend=Platform.dist_backend(device_type))


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.manual_seed(seed)
