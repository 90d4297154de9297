"""FSDP2: shard every decoder layer, then the root, over a 1-D (fsdp) or 2-D (dp, fsdp) mesh.

On a 2-D mesh this is HSDP: parameters are sharded over ``fsdp`` and replicated over
``dp``; gradients are reduce-scattered inside each fsdp group and all-reduced across
the replicas. Parameters become DTensors in place, so the optimizer must be built
after this runs, and a full (gathered) state dict needs
``torch.distributed.checkpoint.state_dict`` (see ``state_dict.py``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh as TorchMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from twinkle.model.transformers.strategy.root import ForwardRoot

_PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def mixed_precision_policy(precision: str) -> MixedPrecisionPolicy:
    """Compute in the model's mixed precision; reduce gradients in float32, so summing many
    ranks' gradients loses nothing to a 16-bit accumulator."""
    param_dtype = _PARAM_DTYPES.get(precision)
    if param_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks to shard one by one: the children of the first ``ModuleList``
    whose entries all have one class (``model.layers`` in Hugging Face decoders)."""
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            kinds = {type(child) for child in module}
            if len(kinds) == 1:
                return list(module)
    return []


def apply_fsdp(model: nn.Module, mesh: TorchMesh, precision: str) -> FSDPModule:
    """Shard ``model`` in place and return its ForwardRoot, now the FSDP root.

    NOTE: the layers are sharded before the root, so each layer's parameters form their
    own all-gather unit; the root gathers what is left (embeddings, final norm, head).
    Parameters already sharded by an earlier strategy (experts over ``ep_fsdp``) stay
    with the module that sharded them: fully_shard skips modules that are FSDP already.
    """
    policy = mixed_precision_policy(precision)
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(
            f"FSDP found no decoder layers in {type(model).__name__} (an nn.ModuleList of "
            "blocks of one class): this model cannot be sharded layer by layer"
        )
    for layer in layers:
        if not isinstance(layer, FSDPModule):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    # The root keeps its parameters (embeddings, head) gathered from forward to backward.
    return fully_shard(ForwardRoot(model), mesh=mesh, mp_policy=policy)


def set_fsdp_gradient_sync(root: FSDPModule, sync: bool) -> None:
    """With False, backward accumulates unsharded local gradients and reduces nothing; the
    next backward with True reduces everything accumulated."""
    root.set_requires_gradient_sync(sync, recurse=True)
