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
them over the tp group after the last backward before a step. A ``HeadSharedTail``
module (MLA's rope key, shared by every head) has that part of its output's gradient
summed over tp in backward, where it flows.

Data parallel over ``dp`` alone (no FSDP): every rank of a tp group holds its DTensor
shards whole, which DDP does not take; :meth:`TensorParallel.average_over_data` does
what DDP would, once per optimizer step: the local gradients averaged over the ranks
with the same tp coordinate.
"""

from __future__ import annotations

from fnmatch import fnmatch

import torch
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
from twinkle.model.families.base import HeadSharedTail, TensorParallelPlan

_WIDTHS = {
    "num_attention_heads": "attention heads",
    "num_key_value_heads": "key/value heads",
    "intermediate_size": "MLP width (intermediate_size)",
    "moe_intermediate_size": "shared experts' width (moe_intermediate_size)",
    "shared_expert_intermediate_size": "shared expert's width (shared_expert_intermediate_size)",
}
_HEADS = ("num_attention_heads", "num_key_value_heads")
_BUCKET = 1 << 22
"""Gradient elements per data-parallel all-reduce (16 MiB of float32)."""


class _SumGradient(torch.autograd.Function):
    """Identity forward; backward sums the gradient over ``group``."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _sum_tail_gradient(width: int, group: dist.ProcessGroup):
    """A forward hook: the last ``width`` output features' gradient summed over ``group``."""

    def hook(module, args, output):
        head, tail = output[..., :-width], output[..., -width:]
        return torch.cat([head, _SumGradient.apply(tail, group)], dim=-1)

    return hook


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
                dist.all_reduce(_local(param.grad), group=self.group)

    @staticmethod
    def average_over_data(params: list[nn.Parameter], group: dist.ProcessGroup) -> None:
        """Average the local gradients of ``params`` over the data-parallel ``group``, as DDP
        does (in buckets, summed then divided by the group's size). A collective: the ranks
        of ``group`` must pass the same parameters in the same order."""
        size = dist.get_world_size(group)
        grads = [_local(p.grad) for p in params if p.grad is not None]
        while grads:
            bucket, total = [], 0
            while grads and (not bucket or total + grads[0].numel() <= _BUCKET):
                total += grads[0].numel()
                bucket.append(grads.pop(0))
            if len({(g.dtype, g.device) for g in bucket}) > 1:
                for grad in bucket:
                    dist.all_reduce(grad, group=group)
                    grad.div_(size)
                continue
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, group=group)
            flat.div_(size)
            for grad, part in zip(bucket, flat.split([g.numel() for g in bucket]), strict=True):
                grad.copy_(part.view_as(grad))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def check_tensor_parallel(config, tp: int, ulysses: int = 1) -> TensorParallelPlan:
    """The family's plan, after checking that ``tp`` divides the widths it splits (and,
    under Ulysses, that each rank's share of the heads splits over ``ulysses``)."""
    family = family_of(config)
    if family is None or family.tp_plan is None:
        raise ValueError(
            f"TransformersModel has no tensor-parallel plan for {model_type_of(config)!r}; "
            f"tp_size works on the {known_families(lambda f: f.tp_plan is not None)} families "
            "(a family file declares tp_plan), or use MegatronModel"
        )
    text = config.get_text_config()
    for attribute in family.tp_plan.widths:
        width, what = getattr(text, attribute, None), _WIDTHS.get(attribute, attribute)
        if width is not None and width % tp:
            raise ValueError(
                f"tp_size={tp} does not divide the model's {width} {what}: each tensor-parallel "
                f"rank holds an equal share; pick a tp_size dividing {width}"
            )
        if width is not None and attribute in _HEADS and width % (tp * ulysses):
            raise ValueError(
                f"tp_size={tp} × ulysses_size={ulysses} = {tp * ulysses} does not divide the "
                f"model's {width} {what}: tensor parallel gives each rank {width // tp} of "
                f"them and Ulysses splits those over its {ulysses} ranks; pick sizes whose "
                f"product divides {width}"
            )
    return family.tp_plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: TorchMesh) -> TensorParallel:
    """Shard ``model`` (a Hugging Face model, peft-wrapped or not) by its family's plan, in
    place; call before FSDP."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    plan = check_tensor_parallel(base.config, tp_mesh.size())
    group, text = tp_mesh.get_group(), base.config.get_text_config()
    summed: list[nn.Module] = []
    for name, module in list(base.named_modules()):
        style = next((s for p, s in plan.styles.items() if fnmatch(name, f"*{p}")), None)
        if style is None or name.endswith(".base_layer"):
            continue
        if style == "replicated_with_grad_allreduce":
            summed.append(module)
            continue
        if isinstance(style, HeadSharedTail):
            module.register_forward_hook(_sum_tail_gradient(getattr(text, style.attribute), group))
            continue
        split = ColwiseParallel if style == "colwise" else RowwiseParallel
        lora = "lora_B" if style == "colwise" else "lora_A"
        layer = getattr(module, "base_layer", None)
        parallelize_module(module if layer is None else layer, tp_mesh, split())
        for adapter in getattr(module, lora, {}).values():
            # The adapter's own split: no layout changes around it beyond the base's.
            parallelize_module(adapter, tp_mesh, split())
    return TensorParallel(group, summed)
