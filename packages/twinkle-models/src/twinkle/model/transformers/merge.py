"""Merge a LoRA adapter into the base weights without disturbing the model being trained.

peft's ``merge_and_unload`` rewrites the model in place, and its ``unmerge``
subtracts the update again, which is off by rounding. Here each adapted layer is
merged by peft on its own, its merged weights are copied to the CPU, and its base
weights are restored bit for bit from a copy, so training continues exactly as if
nothing happened. Extra memory on the device: one layer's base weights at a time.

The result is the state dict of the plain model (the names a Hugging Face model
folder uses): peft's ``base_layer`` levels are removed, adapter tensors are dropped,
and a ``modules_to_save`` copy trained by the adapter replaces the original module.
peft nests one tuner per adapted parameter of a fused MoE experts module
(``experts.base_layer...``): such a chain is merged as one layer, outermost first.
"""

from __future__ import annotations

import torch
from peft import PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils import AuxiliaryTrainingWrapper, ModulesToSaveWrapper


def merged_state_dict(model: PeftModel, adapter_name: str) -> dict[str, torch.Tensor]:
    """The plain model's weights with adapter ``adapter_name`` merged in (on the CPU)."""
    base = model.get_base_model()
    tuners: dict[str, BaseTunerLayer] = {}
    wrappers: dict[str, ModulesToSaveWrapper] = {}
    for path, module in base.named_modules():
        if isinstance(module, BaseTunerLayer):
            outer = path.removesuffix(".base_layer")
            if outer == path or not isinstance(tuners.get(outer), BaseTunerLayer):
                tuners[path] = module  # inner tuners of a chain are merged with the outer one
        elif isinstance(module, ModulesToSaveWrapper):
            wrappers[path] = module
        elif isinstance(module, AuxiliaryTrainingWrapper):
            raise ValueError(
                f"merging supports LoRA layers and modules_to_save; {path} is a "
                f"{type(module).__name__} (e.g. trainable_token_indices), which it does not"
            )
    plain: dict[str, torch.Tensor] = {}
    for key, tensor in base.state_dict().items():
        name = _plain_name(key, adapter_name, tuners, wrappers)
        if name is not None:
            plain[name] = tensor.detach().cpu()
    for path, layer in tuners.items():
        plain.update({f"{path}.{k}": v for k, v in _merge_layer(layer, adapter_name).items()})
    return plain


def _plain_name(
    key: str,
    adapter_name: str,
    tuners: dict[str, BaseTunerLayer],
    wrappers: dict[str, ModulesToSaveWrapper],
) -> str | None:
    """The key in the plain model, or None for a tensor that belongs to an adapter."""
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        owner, rest = ".".join(parts[:i]), parts[i:]
        if owner in tuners:
            if rest[0] != "base_layer":
                return None  # the adapter's own tensors: lora_A, lora_B, ...
            while rest[0] == "base_layer":
                rest = rest[1:]
            if ".".join(rest) not in tuners[owner].get_base_layer().state_dict():
                return None  # an inner tuner's adapter tensors
            return f"{owner}.{'.'.join(rest)}"
        if owner in wrappers:
            trained = adapter_name in wrappers[owner].modules_to_save
            if rest[0] == "original_module" and not trained:
                return f"{owner}.{'.'.join(rest[1:])}"
            if rest[:2] == ["modules_to_save", adapter_name]:
                return f"{owner}.{'.'.join(rest[2:])}"
            return None
    return key


def _merge_layer(layer: BaseTunerLayer, adapter_name: str) -> dict[str, torch.Tensor]:
    """The base layer's parameters with the adapter merged in; the layer is left as it was."""
    base = layer.get_base_layer()
    originals = {name: p.detach().clone() for name, p in base.named_parameters()}
    chain = [layer]
    while isinstance(chain[-1].base_layer, BaseTunerLayer):
        chain.append(chain[-1].base_layer)
    for tuner in chain:
        tuner.merge(adapter_names=[adapter_name])
    try:
        return {name: p.detach().to("cpu", copy=True) for name, p in base.named_parameters()}
    finally:
        for tuner in chain:
            if tuner.merged:
                tuner.unmerge()
        with torch.no_grad():
            for name, p in base.named_parameters():
                p.copy_(originals[name])
