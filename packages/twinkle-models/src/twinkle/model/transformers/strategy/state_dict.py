"""Whole (gathered) weights in and out of a sharded model, and sharded optimizer state.

Saving gathers every parameter to a full CPU tensor on rank 0, which writes the
Hugging Face / peft folder from it; loading hands each rank the full tensors and keeps
its own shards, so weights saved on one mesh load on any other. Optimizer state stays
sharded and goes through ``torch.distributed.checkpoint`` (one file per rank), which
restores it on the same mesh. Under expert parallel each EP rank's expert state is
saved under names of its own (``moe.expert_checkpoint``), so it resumes with the same
ep_size.
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

from twinkle.model.checkpoint import CheckpointError
from twinkle.model.transformers.moe.expert_checkpoint import qualify_expert_keys

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
    model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, key: str = "optimizer"
) -> None:
    """Write the optimizer state with torch.distributed.checkpoint (a collective). ``key``
    names it in the checkpoint: pipeline stages each save under their own (their parameter
    groups differ, and torch.distributed.checkpoint keeps one copy of what is not a tensor)."""
    state = get_optimizer_state_dict(model, optimizer)
    qualify_expert_keys(model, state)
    dcp.save({key: state}, checkpoint_id=folder)


def check_sharded_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, key: str = "optimizer"
) -> None:
    """Every parameter ``optimizer`` steps has state in ``folder``, checked before a resume
    changes anything: another expert-parallel layout names the experts' state otherwise,
    and torch.distributed.checkpoint's own error would not say why."""
    state = get_optimizer_state_dict(model, optimizer)
    qualify_expert_keys(model, state)
    saved = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
    prefixes = {name.rsplit(".", 1)[0] for name in saved}
    missing = [name for name in state["state"] if f"{key}.state.{name}" not in prefixes]
    if missing:
        raise CheckpointError(
            f"{folder} holds no optimizer state for {', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''}: it was saved with another expert-parallel "
            f"layout (ep_size) or other trainable parameters; resume on the mesh it was saved "
            f"on, or pass resume_only_model=True to restore the weights alone"
        )


def load_sharded_optimizer(
    model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, key: str = "optimizer"
) -> None:
    """Restore what ``save_sharded_optimizer`` wrote, on the same mesh (a collective)."""
    state = get_optimizer_state_dict(model, optimizer)
    qualify_expert_keys(model, state)
    dcp.load({key: state}, checkpoint_id=folder)
    qualify_expert_keys(model, state, undo=True)
    set_optimizer_state_dict(model, optimizer, state)
