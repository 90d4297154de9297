"""Where this process runs: device type, visible-devices variable, rank and world size.

Nothing here imports torch at module import time: twinkle-mesh must import on a
laptop without torch. Torch is consulted only when it is installed (for device
detection) or already imported (for the rank of an initialized process group).
"""

from __future__ import annotations

import importlib.util
import os
import sys

DEVICE_TYPES = ("cuda", "npu", "mps", "cpu")
_ALIASES = {"gpu": "cuda"}
_VISIBLE_DEVICES_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}
_DIST_BACKENDS = {"cuda": "nccl", "npu": "hccl", "mps": "gloo", "cpu": "gloo"}


def normalize_device_type(device_type: str) -> str:
    """Lower-case a device type and map the documents' 'GPU' to 'cuda'; reject anything else."""
    if not isinstance(device_type, str):
        raise TypeError(f"device_type must be a string such as 'cuda', got {device_type!r}")
    name = _ALIASES.get(device_type.lower(), device_type.lower())
    if name not in DEVICE_TYPES:
        raise ValueError(
            f"unknown device_type {device_type!r}; use one of {', '.join(DEVICE_TYPES)} (or 'gpu')"
        )
    return name


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _initialized_dist():
    """torch.distributed if torch is already imported and a process group is up, else None."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


class Platform:
    """Facts about the current process, read from torch.distributed or the launcher's env."""

    @staticmethod
    def get_rank() -> int:
        dist = _initialized_dist()
        return dist.get_rank() if dist else _int_env("RANK", 0)

    @staticmethod
    def get_world_size() -> int:
        dist = _initialized_dist()
        return dist.get_world_size() if dist else _int_env("WORLD_SIZE", 1)

    @staticmethod
    def get_local_rank() -> int:
        return _int_env("LOCAL_RANK", 0)

    @staticmethod
    def is_distributed_launch() -> bool:
        """True under torchrun (or any launcher that sets WORLD_SIZE > 1)."""
        return _int_env("WORLD_SIZE", 1) > 1

    @staticmethod
    def detect_device_type() -> str:
        """The best accelerator this process can see: cuda, npu, mps, or cpu."""
        if importlib.util.find_spec("torch") is None:
            return "cpu"
        import torch

        if torch.cuda.is_available():
            return "cuda"
        if hasattr(torch, "npu") and torch.npu.is_available():
            return "npu"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"

    @staticmethod
    def visible_devices_env(device_type: str) -> str | None:
        """The variable that restricts which devices a process sees (None where there is none)."""
        return _VISIBLE_DEVICES_ENV.get(normalize_device_type(device_type))

    @staticmethod
    def dist_backend(device_type: str) -> str:
        """The torch.distributed backend that fits a device type."""
        return _DIST_BACKENDS[normalize_device_type(device_type)]
