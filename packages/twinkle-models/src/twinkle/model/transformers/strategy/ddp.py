"""DDP: every data-parallel rank holds the whole model; gradients are all-reduced in backward.

DDP registers the parameters that require gradients when it is built, so a model
with several LoRA adapters gets one DDP wrapper per adapter, each built while its
adapter is the trainable one (``DDPStrategy.root``). All wrappers share the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from twinkle.model.transformers.moe.expert_parallel import expert_parameters
from twinkle.model.transformers.strategy.root import ForwardRoot

# The model's buffers (rotary tables) are constants computed at init, identical on every rank:
# broadcasting them before every forward would only cost time.
DDP_DEFAULTS = {"broadcast_buffers": False}


def apply_ddp(
    model: nn.Module, group: dist.ProcessGroup, ddp_config: Mapping[str, Any]
) -> DistributedDataParallel:
    """Wrap ``model`` (under a ForwardRoot) in DDP over ``group``; ``ddp_config`` holds
    DistributedDataParallel keyword arguments, which override the defaults."""
    options = {**DDP_DEFAULTS, **ddp_config}
    if "process_group" in options or "device_ids" in options:
        raise ValueError(
            "ddp_config sets process_group/device_ids, which come from the DeviceMesh and the "
            "model's device; remove them"
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("DDP needs trainable parameters: the model has none requiring grad")
    root = ForwardRoot(model)
    # Expert-parallel weights differ per EP rank: DDP must neither broadcast nor average them
    # (sync_expert_gradients reduces them over the ranks holding the same experts).
    experts = {id(p) for p in expert_parameters(model)}
    if experts:
        root._ddp_params_and_buffers_to_ignore = [
            name for name, p in root.named_parameters() if id(p) in experts
        ]
    return DistributedDataParallel(root, process_group=group, **options)


def set_ddp_gradient_sync(wrapper: DistributedDataParallel, sync: bool) -> None:
    """What ``DistributedDataParallel.no_sync()`` does, as a setting: the next forward decides
    whether its backward all-reduces (True) or only accumulates locally (False)."""
    wrapper.require_backward_grad_sync = sync
