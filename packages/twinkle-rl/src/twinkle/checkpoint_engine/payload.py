"""What a weight sync moves, read from the trained model: the plain base weights, the base
weights with an adapter merged in, or one LoRA adapter's tensors and config.

Names are the plain Hugging Face names (peft's ``base_layer`` level removed), which is what a
sampler's ``weight_names()`` lists and ``load_weights`` takes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from peft import PeftModel, get_peft_model_state_dict

from twinkle.model.transformers.merge import merged_state_dict
from twinkle.model.transformers.weights import embedding_policy
from twinkle.sampler.weights import plain_tensors

BASE, LORA = "base", "lora"


@dataclass
class Payload:
    """One message of a sync: ``kind`` 'base' (full tensors by plain name) or 'lora' (an
    adapter's peft state dict, with its ``adapter_name`` and peft ``config``)."""

    kind: str
    tensors: dict[str, torch.Tensor]
    adapter_name: str | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def meta(self) -> dict[str, Any]:
        return {"kind": self.kind, "adapter_name": self.adapter_name, "config": self.config}

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A full tensor even when the trainer shards it (FSDP2 DTensors)."""
    full = getattr(tensor, "full_tensor", None)
    return (full() if full is not None else tensor).detach()


def hf_module(trainer: Any) -> torch.nn.Module:
    """The Hugging Face (or peft) module behind a TransformersModel, or the module itself."""
    module = getattr(trainer, "model", trainer)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"sync_weights needs a TransformersModel or a torch module as the model, got "
            f"{type(trainer).__name__}"
        )
    return module


def adapter_names(module: torch.nn.Module) -> list[str]:
    return list(module.peft_config) if isinstance(module, PeftModel) else []


def base_payload(module: torch.nn.Module) -> Payload:
    """The plain base weights, unmerged (what a sampler running LoRA separately needs)."""
    return Payload(BASE, {n: _local(t) for n, t in plain_tensors(module).items()})


def merged_payload(module: torch.nn.Module, adapter_name: str | None) -> Payload:
    """The base weights with ``adapter_name`` merged in; the plain weights without adapters."""
    if adapter_name is None:
        return base_payload(module)
    merged = merged_state_dict(module, adapter_name)
    return Payload(BASE, {name: _local(merged[name]) for name in plain_tensors(module)})


def lora_payload(module: PeftModel, adapter_name: str) -> Payload:
    # Only LoRA tensors: never the base lm_head/embeddings peft adds when LoRA targets them.
    policy = embedding_policy(module, adapter_name)
    tensors = get_peft_model_state_dict(
        module, adapter_name=adapter_name, save_embedding_layers=policy
    )
    config = module.peft_config[adapter_name].to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    return Payload(LORA, {n: _local(t) for n, t in tensors.items()}, adapter_name, config)


def pick_adapter(adapter_name: str | None, names: list[str]) -> str | None:
    """The adapter a sync reads: the one named, the only one, or 'default'; None without."""
    if adapter_name is not None:
        if adapter_name not in names:
            raise ValueError(f"the model has no adapter {adapter_name!r}; it has {names}")
        return adapter_name
    if len(names) <= 1:
        return names[0] if names else None
    if "default" in names:
        return "default"
    raise ValueError(f"the model has several adapters ({names}): pass adapter_name=")


def sync_payloads(
    trainer: Any, merge_and_sync: bool, adapter_name: str | None, with_base: bool
) -> list[Payload]:
    """What one sync sends, in order: the merged weights (or the plain ones without an
    adapter); or, for ``merge_and_sync=False``, the base weights when ``with_base`` (the first
    sync) and then the adapter's tensors."""
    module = hf_module(trainer)
    adapter = pick_adapter(adapter_name, adapter_names(module))
    if merge_and_sync or adapter is None:
        return [merged_payload(module, adapter)]
    payloads = [base_payload(module)] if with_base else []
    return [*payloads, lora_payload(module, adapter)]


def iter_buckets(
    tensors: dict[str, torch.Tensor], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of tensors of at most ``bucket_bytes`` (a larger tensor alone)."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
