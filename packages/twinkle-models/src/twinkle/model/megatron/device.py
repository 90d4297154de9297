"""Where a MegatronModel runs: a CUDA GPU, an Ascend NPU (with MindSpeed), or the CPU.

The CPU is Megatron's debug device here (``cpu_mode``): gloo for the collectives, chosen
by ``device='cpu'`` or a mesh built with ``device_type='cpu'``, or on its own when the
machine has no GPU and the mesh does not ask for an NPU. A device asked for explicitly and
missing is an error, never a silent CPU run.
"""

from __future__ import annotations

import torch

from twinkle.mesh import Platform
from twinkle.utils import get_logger

logger = get_logger()

DEVICE_TYPES = ("cuda", "npu", "cpu")


def resolve_device(device: str | torch.device | None, mesh_device_type: str) -> torch.device:
    """The device of this rank. ``device`` wins; without it a mesh built for NPUs or for the
    CPU means that device, and otherwise (the meshes' default, 'cuda') a visible GPU is used
    and the CPU is the fallback (logged)."""
    if device is not None:
        (kind, index), why = _parse(device), f"device={str(device)!r}"
    elif mesh_device_type in ("npu", "cpu"):
        kind, index = mesh_device_type, None
        why = f"the mesh's device_type={mesh_device_type!r}"
    elif torch.cuda.is_available():
        kind, index = "cuda", None
    else:
        kind, index, why = "cpu", None, "no CUDA device is visible"
    if kind == "cpu":
        logger.info(
            f"MegatronModel runs on the CPU (gloo), Megatron's debug mode ({why}): slow, for "
            "checking a layout with a small model"
        )
        return torch.device("cpu")
    index = Platform.get_local_rank() if index is None else index
    return _cuda(index) if kind == "cuda" else _npu(index)


def _parse(device: str | torch.device) -> tuple[str, int | None]:
    """(type, index) of a device given as a torch.device or a string such as 'npu:1'
    (torch parses 'npu' only once torch_npu is imported)."""
    if isinstance(device, torch.device):
        kind, index = device.type, device.index
    elif isinstance(device, str):
        kind, _, number = device.partition(":")
        if number and not number.isdigit():
            raise ValueError(f"MegatronModel: device {device!r} has no valid index")
        index = int(number) if number else None
    else:
        raise TypeError(f"device must be a str or a torch.device, got {device!r}")
    if kind not in DEVICE_TYPES:
        raise ValueError(
            f"MegatronModel runs on {', '.join(map(repr, DEVICE_TYPES))}, not {device!r}"
        )
    return kind, index


def _cuda(index: int) -> torch.device:
    if not torch.cuda.is_available():
        raise RuntimeError(
            "MegatronModel(device='cuda') needs a CUDA GPU and none is visible; use "
            "device='cpu' (Megatron's debug mode on gloo) or leave device unset"
        )
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def _npu(index: int) -> torch.device:
    from twinkle.model.megatron._mindspeed_runtime import (
        ensure_mindspeed_adaptor_patched,
        require_npu,
    )

    require_npu("MegatronModel on an NPU")
    ensure_mindspeed_adaptor_patched()
    device = torch.device("npu", index)
    torch.npu.set_device(device)
    return device


def dist_backend(device: torch.device) -> str:
    """The torch.distributed backend for this device (gloo for the CPU mode)."""
    return Platform.dist_backend(device.type)
