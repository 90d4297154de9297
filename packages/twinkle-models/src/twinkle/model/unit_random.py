"""Randomness of one trainable unit: seeds derived from names, and a unit's own generators.

Tenants of one base model (``MultiLoraTransformersModel``) must not share randomness: with
``lora_dropout`` > 0, one process-wide torch generator would make a tenant's dropout masks,
and so its losses, depend on how many forwards its neighbours ran, and one tenant's resume
would reset the generator for all. A ``RandomStream`` holds a unit's own torch generator
states (CPU and the model's accelerator), swapped in around that unit's forward passes and
saved with its checkpoint. ``derived_seed`` gives every (seed, name, purpose) its own seed,
so a LoRA adapter's initial weights depend on the model's seed and the adapter's name only.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

import torch


def derived_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed determined by ``seed`` and ``parts`` alone (the same in every process,
    unlike ``hash``)."""
    text = "\0".join(str(part) for part in (seed, *parts))
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _accelerator(device: torch.device) -> Any:
    """torch.cuda, torch.npu, ... for a device with its own generator; None for the CPU."""
    if device.type == "cpu":
        return None
    return getattr(torch, device.type, None)


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Draw from generators seeded with ``seed`` inside the block, leaving the process's
    random state (CPU and ``device``) as it was."""
    devices = [] if _accelerator(device) is None else [device]
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        torch.manual_seed(seed)
        yield


class RandomStream:
    """The torch generator states (CPU, and the accelerator of ``device``) of one unit.

    ``drawing()`` makes them the process's generators for the duration of the block and
    keeps where they ended up; outside it the process's own states are untouched.
    """

    def __init__(self, seed: int, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.Generator().manual_seed(seed).get_state()
        module = _accelerator(device)
        self.accelerator = (
            None if module is None else torch.Generator(device).manual_seed(seed).get_state()
        )

    @contextlib.contextmanager
    def drawing(self) -> Iterator[None]:
        module = _accelerator(self.device) if self.accelerator is not None else None
        outer_cpu = torch.get_rng_state()
        outer_accelerator = None if module is None else module.get_rng_state(self.device)
        torch.set_rng_state(self.cpu)
        if module is not None:
            module.set_rng_state(self.accelerator, self.device)
        try:
            yield
        finally:
            self.cpu = torch.get_rng_state()
            torch.set_rng_state(outer_cpu)
            if module is not None:
                self.accelerator = module.get_rng_state(self.device)
                module.set_rng_state(outer_accelerator, self.device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {"torch": self.cpu.clone()}
        if self.accelerator is not None:
            state["accelerator"] = self.accelerator.clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a ``state_dict()``; an accelerator state saved on another kind of
        device (or none) leaves the accelerator stream where it is."""
        self.cpu = state["torch"].clone()
        if self.accelerator is not None and "accelerator" in state:
            self.accelerator = state["accelerator"].clone()

    def load_process_state(self, state: dict[str, Any]) -> None:
        """Continue from a process-wide ``capture_rng_state()`` (a checkpoint written by a
        model whose units drew from the process's generators)."""
        stream = {"torch": state["torch"]}
        device = state.get("device")
        if device is not None and device["type"] == self.device.type:
            index = self.device.index or 0
            if index < len(device["states"]):
                stream["accelerator"] = device["states"][index]
        self.load_state_dict(stream)
