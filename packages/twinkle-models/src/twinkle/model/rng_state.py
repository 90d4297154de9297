"""Capture and restore every random number generator a training step draws from.

Dropout (LoRA's included) draws from torch's generators, and user code may draw
from Python's ``random`` or numpy's global generator; a resumed run reproduces the
uninterrupted one only when all of them continue from where they stood. The state
is a dict of tensors, ints, floats and tuples, so ``torch.load(weights_only=True)``
reads it back without unpickling arbitrary objects.

Scope: the generators of this process. Accelerator generators are those of the
device type given (``cuda``, ``npu``, ...), one per visible device.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from twinkle.utils import get_logger

logger = get_logger()


def _device_module(device_type: str | None) -> Any:
    """torch.cuda, torch.npu, ... when that device keeps per-device generators, else None."""
    if device_type in (None, "cpu"):
        return None
    module = getattr(torch, device_type, None)
    if module is None or not hasattr(module, "get_rng_state_all"):
        return None
    return module


def capture_rng_state(device_type: str | None = None) -> dict[str, Any]:
    """The current state of Python's, numpy's, torch's CPU and the device's generators."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    module = _device_module(device_type)
    if module is not None:
        state["device"] = {"type": device_type, "states": list(module.get_rng_state_all())}
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put every generator back where ``capture_rng_state`` found it.

    A device state saved for another device type or device count cannot be
    restored; that is logged, and the CPU generators are restored regardless.
    """
    random.setstate(state["python"])
    saved = state["numpy"]
    np.random.set_state(
        (
            saved["bit_generator"],
            saved["keys"].numpy().astype(np.uint32),
            saved["pos"],
            saved["has_gauss"],
            saved["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    device = state.get("device")
    if device is None:
        return
    module = _device_module(device["type"])
    if module is None or module.device_count() != len(device["states"]):
        logger.warning(
            f"the checkpoint holds the random state of {len(device['states'])} {device['type']} "
            f"device(s), which this process does not have: their generators start afresh"
        )
        return
    module.set_rng_state_all(device["states"])
