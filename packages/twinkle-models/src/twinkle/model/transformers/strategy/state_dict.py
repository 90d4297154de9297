"""Whole (gathered) weights in and out of a sharded model, and sharded optimizer state.

Saving gathers every parameter to a full CPU tensor on rank 0, which writes the
Hugging Face / peft folder from it; loading hands each rank the full tensors and keeps
its own shards, so weights saved on one mesh load on any other. Optimizer state stays
sharded and goes through ``torch.distributed.checkpoint`` (one file per rank), which
restores it on the same mesh.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer of ``model`` as a whole CPU tensor, on rank 0;
    the other ranks get an empty dict (a collective: every rank calls it)."""
    return get_model_state_dict(model, options=_FULL)


def load_full_model_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy whole tensors into ``model``'s (possibly sharded) parameters; keys absent from
    ``state`` keep their values (a collective)."""
    options = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, state, options=options)


def save_sharded_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path
) -> None:
    """Write the optimizer state with torch.distributed.checkpoint (a collective)."""
    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)}, checkpoint_id=folder)


def load_sharded_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path
) -> None:
    """Restore what ``save_sharded_optimizer`` wrote, on the same mesh (a collective)."""
    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=folder)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
