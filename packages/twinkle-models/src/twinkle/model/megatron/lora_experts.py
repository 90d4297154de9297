"""LoRA on a mixture-of-experts layer (Qwen3-MoE), in peft's form for the Hugging Face model.

transformers 5 fuses a Qwen3-MoE layer's experts into two 3-D tensors, ``experts.gate_up_proj``
(E, 2I, H) and ``experts.down_proj`` (E, H, I), and peft 0.21 adapts them as parameters
(``target_parameters``; ``target_modules`` naming gate_proj/up_proj/down_proj, the router
``gate`` or 'all-linear' is rewritten to that by peft itself, ``peft_config_for``). Per
adapted tensor peft holds one pair ``A`` (E·r, in) and ``B`` (out, r·E); expert ``e``'s delta
is ``scale · B_e @ A_e`` with ``A_e = A.reshape(E, r, in)[e]`` (its rows together) and
``B_e = B.reshape(out, r, E)[:, :, e]`` (its columns interleaved with the other experts').
The fused gate_up tensor gets rank 2r and alpha 2·lora_alpha (peft's rank and alpha
patterns). The router's 2-D weight (E, H) gets a plain pair.

Megatron (local spec, ``SequentialMLP``) holds each local expert as an MLP whose
``linear_fc1`` is [gate; up] and ``linear_fc2`` the down projection, so expert ``e``'s pair
sits on its own linear (``ExpertLoraLinear``): expert parallelism needs no communication in
the LoRA path, and export gathers the local experts over the expert-parallel group.
Under expert tensor parallelism the token dispatcher has already gathered the tokens and
sums the partial outputs (and input gradients), so the LoRA path adds a partial output on
each rank: ``fc1``'s ``B`` and ``fc2``'s ``A`` are sharded like the base weight, and the
replicated factor's gradient, partial on each rank, is summed over the expert-tensor-parallel
group (``_SumGradient``).

peft wraps parameters of one module in registration order, the first innermost, so with
both expert tensors adapted gate_up's pair is saved under ``experts.base_layer.lora_*`` and
down_proj's under ``experts.lora_*``; with one of them, under ``experts.lora_*``.
"""

from __future__ import annotations

import copy
import math
from functools import partial

import torch
from torch import nn

from twinkle.model.families import family_of

# transformers' Qwen3MoeExperts registers gate_up_proj before down_proj.
EXPERT_TENSORS = ("gate_up_proj", "down_proj")
ROUTER = "gate.weight"
# Megatron expert linear -> (peft tensor, column-parallel)
EXPERT_LINEARS = {"linear_fc1": ("gate_up_proj", True), "linear_fc2": ("down_proj", False)}
# Seed offsets after the dense projections' (0..6), so dense and expert inits never collide.
SEED_OFFSET = {"gate_up_proj": 7, "down_proj": 8, ROUTER: 9}


def peft_config_for(config, hf_config):
    """The LoraConfig as peft applies it to this Hugging Face model (a copy).

    For MoE families (Qwen3-MoE) peft rewrites expert and router targets into
    ``target_parameters`` with fused ranks; doing the same rewrite here lets MegatronModel
    train, save and reload exactly what peft loads. Other models are returned unchanged.
    """
    family = family_of(hf_config)
    if family is None or family.moe is None:
        return config
    from peft.utils.transformers_weight_conversion import convert_peft_config_for_transformers
    from transformers import AutoModelForCausalLM

    converted = copy.deepcopy(config)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config)
    convert_peft_config_for_transformers(converted, model=skeleton, conversions=None)
    return converted


def parse_target_parameters(names) -> tuple[tuple[str, ...], bool]:
    """(expert tensors, whether the router is adapted) from peft's target_parameters."""
    experts, router, unknown = set(), False, []
    for name in sorted(names or ()):
        short = name.rpartition(".")[-1]
        if name == ROUTER or name.endswith("." + ROUTER):
            router = True
        elif short in EXPERT_TENSORS:
            experts.add(short)
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(
            f"LoRA target_parameters {unknown}: MegatronModel adapts the experts' gate_up_proj "
            f"and down_proj and the router's {ROUTER} of a Qwen3-MoE model; drop the others"
        )
    return tuple(t for t in EXPERT_TENSORS if t in experts), router


class _SumGradient(torch.autograd.Function):
    """Identity forward; the gradient summed over ``group`` (a factor replicated on ranks
    that each see part of its gradient)."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        import torch.distributed as dist

        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def _mark(param: nn.Parameter, sharded_dim: int | None) -> None:
    """Megatron's attributes: tensor-parallel if sharded, expert-parallel (reduced over the
    expert data-parallel group) always."""
    from megatron.core.tensor_parallel.layers import (
        set_defaults_if_not_set_tensor_model_parallel_attributes,
        set_tensor_model_parallel_attributes,
    )

    if sharded_dim is None:
        set_defaults_if_not_set_tensor_model_parallel_attributes(param)
    else:
        set_tensor_model_parallel_attributes(param, True, sharded_dim, 1)
    param.allreduce = False


class ExpertLoraLinear(nn.Module):
    """One local expert's fc1 or fc2 plus its LoRA pair (this rank's shard)."""

    def __init__(
        self,
        base: nn.Module,
        tensor: str,
        r: int,
        scale: float,
        in_features: int,
        out_features: int,
        column_parallel: bool,
    ) -> None:
        super().__init__()
        self.base, self.tensor, self.scale = base, tensor, scale
        self.column_parallel = column_parallel
        self.group = base.tp_group  # the expert-tensor-parallel group
        like = base.weight
        self.lora_A = nn.Parameter(like.new_zeros(r, in_features))
        self.lora_B = nn.Parameter(like.new_zeros(out_features, r))
        _mark(self.lora_A, None if column_parallel else 1)
        _mark(self.lora_B, 0 if column_parallel else None)

    def forward(self, x: torch.Tensor, *args, **kwargs):
        output, bias = self.base(x, *args, **kwargs)
        a, b = self.lora_A, self.lora_B
        if self.group.size() > 1:
            if self.column_parallel:
                a = _SumGradient.apply(a, self.group)
            else:
                b = _SumGradient.apply(b, self.group)
        return output + (x @ a.t()) @ b.t() * self.scale, bias


class RouterLora(nn.Module):
    """The router weight's pair (replicated); the router computes with ``W + scale·B@A``."""

    def __init__(self, router: nn.Module, r: int, scale: float, sequence_parallel: bool) -> None:
        super().__init__()
        self.scale = scale
        experts, hidden = router.weight.shape
        self.lora_A = nn.Parameter(router.weight.new_zeros(r, hidden))
        self.lora_B = nn.Parameter(router.weight.new_zeros(experts, r))
        for param in (self.lora_A, self.lora_B):
            _mark_router(param, sequence_parallel)

    def weight(self, base: torch.Tensor) -> torch.Tensor:
        return base + self.scale * (self.lora_B @ self.lora_A)


def _mark_router(param: nn.Parameter, sequence_parallel: bool) -> None:
    """Like the router weight: replicated, summed over tp under sequence parallel."""
    from megatron.core.tensor_parallel.layers import (
        set_defaults_if_not_set_tensor_model_parallel_attributes,
    )

    set_defaults_if_not_set_tensor_model_parallel_attributes(param)
    param.sequence_parallel = sequence_parallel


def _lora_gating(router: nn.Module, input: torch.Tensor) -> torch.Tensor:
    """megatron-core 0.16's TopKRouter.gating with the adapted weight."""
    from megatron.core.transformer.moe.moe_utils import router_gating_linear

    dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(
        router.config.moe_router_dtype, input.dtype
    )
    weight = router.lora.weight(router.weight)
    return router_gating_linear(input, weight, router.bias, dtype)


def _kaiming(shape: tuple[int, int], seed: int) -> torch.Tensor:
    """peft's init of ``A`` (nn.Linear's), drawn from ``seed`` in full on every rank."""
    full = torch.empty(shape)
    nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=torch.Generator().manual_seed(seed))
    return full


def _experts_of(layer: nn.Module):
    """This rank's local experts of a MoE layer (SequentialMLP), or None for a dense layer."""
    experts = getattr(layer.mlp, "experts", None)
    if experts is None:
        return None
    if not hasattr(experts, "local_experts"):
        raise ValueError(
            f"LoRA on experts needs Megatron's SequentialMLP (local spec, moe_grouped_gemm off); "
            f"this model's experts are {type(experts).__name__}"
        )
    return experts


def expert_placement() -> tuple[int, int, int, int]:
    """(ep rank, ep size, etp rank, etp size) of this process."""
    from megatron.core import parallel_state as ps

    return (
        ps.get_expert_model_parallel_rank(),
        ps.get_expert_model_parallel_world_size(),
        ps.get_expert_tensor_parallel_rank(),
        ps.get_expert_tensor_parallel_world_size(),
    )


def _shard(tensor: str, a: torch.Tensor, b: torch.Tensor, rank: int, size: int):
    """Expert-tensor-parallel shard of one expert's full pair."""
    if tensor == "gate_up_proj":  # column: B's rows [gate; up], each half split
        gate, up = b.chunk(2)
        return a, torch.cat([gate.chunk(size)[rank], up.chunk(size)[rank]])
    return a.chunk(size, dim=1)[rank], b  # row: A's columns split


def inject_expert_lora(gpt_model: nn.Module, settings, config, seed: int) -> None:
    """Wrap each local expert's targeted linears and the router (A as peft draws it, B = 0)."""
    ep_rank, ep, etp_rank, etp = expert_placement()
    for layer in gpt_model.decoder.layers:
        experts = _experts_of(layer)
        if experts is None:
            continue
        global_layer = layer.layer_number - 1
        num_local = len(experts.local_experts)
        first = ep_rank * num_local
        for attr, (tensor, column) in EXPERT_LINEARS.items():
            if tensor not in settings.expert_targets:
                continue
            r, scale = settings.rank_and_scale(expert_key(global_layer, tensor))
            full_a = None
            for j, expert in enumerate(experts.local_experts):
                base = getattr(expert, attr)
                out_full, in_full = _full_shape(base, column, etp)
                if full_a is None:
                    num_experts = num_local * ep
                    full_a = _kaiming(
                        (num_experts * r, in_full),
                        seed * 1_000_003 + global_layer * 101 + SEED_OFFSET[tensor],
                    ).reshape(num_experts, r, in_full)
                a, b = _shard(tensor, full_a[first + j], torch.zeros(out_full, r), etp_rank, etp)
                wrapper = ExpertLoraLinear(base, tensor, r, scale, a.shape[1], b.shape[0], column)
                with torch.no_grad():
                    wrapper.lora_A.copy_(a)
                setattr(expert, attr, wrapper)
        if settings.router:
            router = layer.mlp.router
            r, scale = settings.rank_and_scale(router_key(global_layer))
            router.lora = RouterLora(router, r, scale, bool(config.sequence_parallel))
            seed_of_router = seed * 1_000_003 + global_layer * 101 + SEED_OFFSET[ROUTER]
            a = _kaiming(tuple(router.lora.lora_A.shape), seed_of_router)
            with torch.no_grad():
                router.lora.lora_A.copy_(a)
            router.gating = partial(_lora_gating, router)


def _full_shape(base: nn.Module, column: bool, etp: int) -> tuple[int, int]:
    out_features, in_features = base.weight.shape
    return (out_features * etp, in_features) if column else (out_features, in_features * etp)


def expert_key(layer: int, tensor: str) -> str:
    """The Hugging Face parameter peft's rank and alpha patterns are matched against."""
    return f"model.layers.{layer}.mlp.experts.{tensor}"


def router_key(layer: int) -> str:
    return f"model.layers.{layer}.mlp.{ROUTER}"


def peft_prefix(layer: int, tensor: str, adapted: tuple[str, ...]) -> str:
    """peft's saved-name prefix of an expert tensor's pair (nesting: see the module doc)."""
    depth = len(adapted) - 1 - adapted.index(tensor)
    return f"base_model.model.model.layers.{layer}.mlp.experts." + "base_layer." * depth


def router_prefix(layer: int) -> str:
    return f"base_model.model.model.layers.{layer}.mlp.gate."


def _adapted(experts: nn.Module) -> tuple[str, ...]:
    expert = experts.local_experts[0]
    return tuple(
        tensor
        for attr, (tensor, _) in EXPERT_LINEARS.items()
        if isinstance(getattr(expert, attr), ExpertLoraLinear)
    )


def _gather(tensor: torch.Tensor, group) -> list[torch.Tensor]:
    import torch.distributed as dist

    if group.size() == 1:
        return [tensor]
    pieces = [torch.empty_like(tensor) for _ in range(group.size())]
    dist.all_gather(pieces, tensor.contiguous(), group=group)
    return pieces


def _whole_pair(module: ExpertLoraLinear) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's full pair, gathered over the expert-tensor-parallel group."""
    a, b = module.lora_A.detach(), module.lora_B.detach()
    if module.column_parallel:
        halves = [piece.chunk(2) for piece in _gather(b, module.group)]
        return a, torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    return torch.cat(_gather(a, module.group), dim=1), b


@torch.no_grad()
def gather_expert_lora(gpt_model: nn.Module) -> dict[str, torch.Tensor]:
    """This stage's expert and router pairs under peft's names and shapes (all experts)."""
    from megatron.core import parallel_state

    ep_group = parallel_state.get_expert_model_parallel_group()
    out = {}
    for layer in gpt_model.decoder.layers:
        experts = _experts_of(layer)
        if experts is None:
            continue
        global_layer = layer.layer_number - 1
        adapted = _adapted(experts)
        for attr, (tensor, _) in EXPERT_LINEARS.items():
            if tensor not in adapted:
                continue
            pairs = [_whole_pair(getattr(e, attr)) for e in experts.local_experts]
            a = torch.cat(_gather(torch.stack([p[0] for p in pairs]), ep_group))  # (E, r, in)
            b = torch.cat(_gather(torch.stack([p[1] for p in pairs]), ep_group))  # (E, out, r)
            prefix = peft_prefix(global_layer, tensor, adapted)
            out[prefix + "lora_A.weight"] = a.reshape(-1, a.shape[-1]).cpu().clone()
            # (E, out, r) -> (out, r, E) -> (out, r·E): expert e's columns e, E + e, ...
            out[prefix + "lora_B.weight"] = b.permute(1, 2, 0).reshape(b.shape[1], -1).cpu().clone()
        lora = getattr(layer.mlp.router, "lora", None)
        if isinstance(lora, RouterLora):
            prefix = router_prefix(global_layer)
            out[prefix + "lora_A.weight"] = lora.lora_A.detach().cpu().clone()
            out[prefix + "lora_B.weight"] = lora.lora_B.detach().cpu().clone()
    return out


def _read(weights: dict, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    missing = [k for k in ("A", "B") if f"{prefix}lora_{k}.weight" not in weights]
    if missing:
        raise ValueError(f"the adapter has no {prefix}lora_{missing[0]}.weight")
    return weights[f"{prefix}lora_A.weight"], weights[f"{prefix}lora_B.weight"]


def _copy(target: nn.Parameter, value: torch.Tensor, name: str) -> None:
    if target.shape != value.shape:
        raise ValueError(
            f"{name}: the adapter's shard has shape {tuple(value.shape)}, the model's "
            f"{tuple(target.shape)}: it was trained with another r or model"
        )
    target.copy_(value)


@torch.no_grad()
def load_expert_lora(gpt_model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Fill the expert and router pairs from peft-named weights, this rank's shards only."""
    ep_rank, ep, etp_rank, etp = expert_placement()
    for layer in gpt_model.decoder.layers:
        experts = _experts_of(layer)
        if experts is None:
            continue
        global_layer = layer.layer_number - 1
        adapted = _adapted(experts)
        num_local = len(experts.local_experts)
        for attr, (tensor, _) in EXPERT_LINEARS.items():
            if tensor not in adapted:
                continue
            prefix = peft_prefix(global_layer, tensor, adapted)
            a, b = _read(weights, prefix)
            r = a.shape[0] // (num_local * ep)
            per_expert_a = a.reshape(num_local * ep, r, a.shape[-1])
            per_expert_b = b.reshape(b.shape[0], r, num_local * ep)
            for j, expert in enumerate(experts.local_experts):
                e = ep_rank * num_local + j
                sa, sb = _shard(tensor, per_expert_a[e], per_expert_b[:, :, e], etp_rank, etp)
                module = getattr(expert, attr)
                _copy(module.lora_A, sa, f"{prefix}lora_A.weight (expert {e})")
                _copy(module.lora_B, sb, f"{prefix}lora_B.weight (expert {e})")
        lora = getattr(layer.mlp.router, "lora", None)
        if isinstance(lora, RouterLora):
            prefix = router_prefix(global_layer)
            a, b = _read(weights, prefix)
            _copy(lora.lora_A, a, prefix + "lora_A.weight")
            _copy(lora.lora_B, b, prefix + "lora_B.weight")


def merge_expert_lora(
    weights: dict[str, torch.Tensor], lora: dict[str, torch.Tensor], settings
) -> dict[str, torch.Tensor]:
    """Merge the expert pairs into the fused Hugging Face expert tensors (in place) and
    return the other pairs (router and dense ones) for the plain ``W + scale·B@A`` merge."""
    rest = dict(lora)
    for layer_name in sorted({k.split(".mlp.experts.")[0] for k in lora if ".mlp.experts." in k}):
        layer = int(layer_name.rsplit(".", 1)[-1])
        adapted = settings.expert_targets
        for tensor in adapted:
            prefix = peft_prefix(layer, tensor, adapted)
            a, b = rest.pop(prefix + "lora_A.weight"), rest.pop(prefix + "lora_B.weight")
            name = expert_key(layer, tensor)
            base = weights[name]
            experts = base.shape[0]
            a = a.float().reshape(experts, -1, a.shape[-1])
            b = b.float().reshape(b.shape[0], -1, experts)
            _, scale = settings.rank_and_scale(name)
            delta = torch.einsum("ore,eri->eoi", b, a) * scale
            weights[name] = (base.float() + delta).to(base.dtype)
    return rest
