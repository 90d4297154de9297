"""Tensor parallel with torch's DTensor: the family's plan (``twinkle.model.families``)
splits each decoder layer's attention heads and MLP width over the ``tp`` ranks.

``colwise`` linears (q/k/v, gate/up) keep their slice of the outputs, ``rowwise`` ones
(o, down) take that slice and all-reduce their outputs, so everything between layers
(norms, embeddings, the head, the loss) is whole on every tp rank and sees the same
batch. Under LoRA the adapter follows its base layer: a colwise layer's ``lora_B`` is
split like the base's outputs, a rowwise layer's ``lora_A`` like its inputs; the other
LoRA matrix stays whole and gets its whole gradient through the DTensor redistributions.
Weights a plan marks ``replicated_with_grad_allreduce`` (Qwen3's per-head q/k norms) get
a gradient from this rank's heads only; :meth:`TensorParallel.reduce_gradients` sums
them over the tp group after the last backward before a step.
"""

from __future__ import annotations

from fnmatch import fnmatch

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh as TorchMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from twinkle.model.families import family_of, known_families, model_type_of

_WIDTHS = (
    ("num_attention_heads", "attention heads"),
    ("num_key_value_heads", "key/value heads"),
    ("intermediate_size", "MLP width (intermediate_size)"),
)


class TensorParallel:
    """What ``apply_tensor_parallel`` did: the tp group and the modules whose weights'
    gradients it must sum after backward (modules, not parameters: FSDP2 replaces the
    parameters it shards)."""

    def __init__(self, group: dist.ProcessGroup, summed: list[nn.Module]) -> None:
        self.group = group
        self.summed = summed

    def reduce_gradients(self) -> None:
        """Sum the ``replicated_with_grad_allreduce`` gradients over the tp ranks (a
        collective)."""
        for param in (p for module in self.summed for p in module.parameters()):
            if param.grad is not None:
                grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                dist.all_reduce(grad, group=self.group)


def check_tensor_parallel(config, tp: int) -> dict[str, str]:
    """The family's plan, after checking that ``tp`` divides the widths it splits."""
    family = family_of(config)
    if family is None or family.tp_plan is None:
        raise ValueError(
            f"TransformersModel has no tensor-parallel plan for {model_type_of(config)!r}; "
            f"tp_size works on the {known_families(lambda f: f.tp_plan is not None)} families "
            "(a family file declares tp_plan), or use MegatronModel"
        )
    text = config.get_text_config()
    for attribute, what in _WIDTHS:
        width = getattr(text, attribute, None)
        if width is not None and width % tp:
            raise ValueError(
                f"tp_size={tp} does not divide the model's {width} {what}: each tensor-parallel "
                f"rank holds an equal share; pick a tp_size dividing {width}"
            )
    return family.tp_plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: TorchMesh) -> TensorParallel:
    """Shard ``model`` (a Hugging Face model, peft-wrapped or not) by its family's plan, in
    place; call before FSDP."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    plan = check_tensor_parallel(base.config, tp_mesh.size())
    summed: list[nn.Module] = []
    for name, module in list(base.named_modules()):
        style = next((s for p, s in plan.items() if fnmatch(name, f"*{p}")), None)
        if style is None or name.endswith(".base_layer"):
            continue
        if style == "replicated_with_grad_allreduce":
            summed.append(module)
            continue
        split = ColwiseParallel() if style == "colwise" else RowwiseParallel()
        lora = "lora_B" if style == "colwise" else "lora_A"
        layer = getattr(module, "base_layer", None)
        parallelize_module(module if layer is None else layer, tp_mesh, split)
        for adapter in getattr(module, lora, {}).values():
            # The adapter's own split: no layout changes around it beyond the base's.
            parallelize_module(adapter, tp_mesh, type(split)())
    return TensorParallel(tp_mesh.get_group(), summed)
