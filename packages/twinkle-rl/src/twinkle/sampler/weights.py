"""Receiving weights into a Hugging Face model that may be wrapped by peft: base tensors by
their plain Hugging Face names, and LoRA adapters by their peft config and state dict."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict
from torch.distributed.tensor import DTensor


def plain_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base weights by the names a Hugging Face folder uses; peft's ``base_layer`` level
    is removed, adapter tensors are left out, and tied weights (an output head sharing the
    embedding) appear once, under their first name, so a sync moves them once."""
    base = model.get_base_model() if isinstance(model, PeftModel) else model
    tensors, seen = {}, set()
    for name, tensor in base.state_dict(keep_vars=True).items():
        if ".lora_" in name or ".modules_to_save." in name:
            continue
        # A sharded (FSDP2) tensor has no storage of its own: tied weights are one object.
        storage = (
            id(tensor)
            if isinstance(tensor, DTensor)
            else (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape)
        )
        if storage in seen:
            continue
        seen.add(storage)
        tensors[name.replace(".base_layer.", ".")] = tensor
    return tensors


@torch.no_grad()
def copy_weights(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy tensors into the base weights by name; returns how many were copied."""
    targets = plain_tensors(model)
    copied = 0
    for name, tensor in weights:
        target = targets.get(name)
        if target is None:
            raise ValueError(
                f"the sampler's model has no weight named {name!r}: model and sampler must "
                f"have the same architecture (sampler weights look like "
                f"{', '.join(sorted(targets)[:3])}, ...)"
            )
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"weight {name!r} has shape {tuple(tensor.shape)} but the sampler's has "
                f"{tuple(target.shape)}: model and sampler must have the same architecture"
            )
        target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        copied += 1
    return copied


def install_lora(
    model: torch.nn.Module,
    adapter_name: str,
    config: Mapping[str, Any],
    weights: Mapping[str, torch.Tensor],
) -> torch.nn.Module:
    """``model`` with adapter ``adapter_name`` built from ``config`` (re-created when the config
    changed) holding ``weights``; returns the PeftModel (the same one when it already was)."""
    lora = LoraConfig(**{k: v for k, v in config.items() if k in LoraConfig.__dataclass_fields__})
    lora.inference_mode = True
    if not isinstance(model, PeftModel):
        model = get_peft_model(model, lora, adapter_name=adapter_name)
    elif adapter_name not in model.peft_config:
        model.add_adapter(adapter_name, lora)
    elif model.peft_config[adapter_name].to_dict() != lora.to_dict():
        model.delete_adapter(adapter_name)
        model.add_adapter(adapter_name, lora)
    result = set_peft_model_state_dict(model, dict(weights), adapter_name=adapter_name)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(
            f"adapter {adapter_name!r}: tensors {unexpected[:3]} do not fit its config; model "
            "and sampler must have the same architecture"
        )
    return model
