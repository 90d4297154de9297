"""Expert parallel for Hugging Face MoE models whose experts are fused 3-D parameters.

``apply_expert_parallel`` finds every MoE block as the model's family declares it
(``twinkle.model.families``: a router and fused ``experts`` with ``gate_up_proj (E, 2I, H)``
and ``down_proj (E, H, I)``, maybe shared experts), keeps this EP rank's ``E/ep`` experts
(``shard_experts``) and replaces the block's forward with the all-to-all one
(``patch_forward``; see ``dispatch``), routing as the family's router does: Qwen3-MoE and
Qwen3.5-MoE (softmax top-k, Qwen3.5's gated shared expert), DeepSeek-V3 and GLM-4.5
(sigmoid scores with a bias, group-limited top-k, shared experts).

Gradients. Each expert lives on one EP rank and its gradient already sums the tokens of
the whole EP group (they came to it through the all-to-all). So expert gradients must not
be reduced over the dense data-parallel group as dense ones are (that would mix different
experts that happen to share a shape): ``expert_parameters(model)`` stay out of the dense
DDP/FSDP. When the dense model is FSDP-sharded, each experts module is its own FSDP unit
over the ranks holding the same experts (``expert_fsdp``: sharded over ``ep_fsdp``);
under DDP, ``sync_expert_gradients`` reduces them. Either way the reduction is scaled
like DDP's, so the wrapper's one division by the global token count fits every gradient.
A global gradient norm must add the squares of every EP rank's experts: each expert
parameter carries its EP process group as ``expert_parallel_group``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from twinkle.mesh import DeviceMesh
from twinkle.model.families import (
    DECLARES,
    EXPERT_WEIGHTS,
    ModelFamily,
    MoeLayout,
    family_of,
    known_families,
    model_type_of,
    own_forward,
)
from twinkle.model.transformers.moe.dispatch import dispatch_and_combine, run_local_experts
from twinkle.model.transformers.moe.expert_fsdp import shard_experts_fsdp

ROUTER_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class ExpertParallelConfig:
    """``router_dtype``: the router matmul's precision ('fp32', 'bf16' or 'fp16');
    ``keep_router_logits``: return router logits (for the load-balancing loss);
    ``ignore_shared_experts``: skip the shared experts (the output lacks their term);
    ``ep_size``: defaults to the DeviceMesh's and must match it when given."""

    enabled: bool = True
    router_dtype: str = "fp32"
    keep_router_logits: bool = True
    ignore_shared_experts: bool = False
    ep_size: int | None = None

    def __post_init__(self) -> None:
        if self.router_dtype not in ROUTER_DTYPES:
            raise ValueError(
                f"router_dtype must be one of {', '.join(ROUTER_DTYPES)}, got {self.router_dtype!r}"
            )


def moe_family(model: nn.Module, ep_size: int) -> ModelFamily:
    """The model's family, which must declare an MoE layout; else an error naming the
    families expert parallel knows and what a family file declares."""
    config = getattr(model, "config", None)
    family = None if config is None else family_of(config)
    if family is not None and family.moe is None:
        raise ValueError(
            f"ep_size={ep_size} needs a mixture-of-experts model, but {family.name} is a dense "
            "family (no MoE block); drop ep_size from the DeviceMesh for a dense model"
        )
    if family is None:
        model_type = model_type_of(config) if config is not None else type(model).__name__
        raise ValueError(
            f"expert parallel does not know the model family {model_type!r}; it knows "
            f"{known_families(lambda f: f.moe is not None)}. To add one, {DECLARES}"
        )
    return family


def find_moe_blocks(model: nn.Module, family: ModelFamily) -> list[nn.Module]:
    return [m for m in model.modules() if family.is_moe_block(m)]


def shard_experts(experts: nn.Module, ep_rank: int, ep_size: int) -> None:
    """Keep experts ``[ep_rank * E/ep, (ep_rank + 1) * E/ep)`` of a fused experts module."""
    total = experts.gate_up_proj.shape[0]
    if total % ep_size:
        raise ValueError(
            f"{type(experts).__name__} has {total} experts, which ep_size={ep_size} does not "
            f"divide; choose an ep_size that divides the number of experts"
        )
    extra = [n for n, p in experts.named_parameters(recurse=False) if n not in EXPERT_WEIGHTS]
    if extra:
        raise NotImplementedError(
            f"{type(experts).__name__} has parameters {extra} besides {EXPERT_WEIGHTS}; expert "
            f"parallel handles bias-free fused experts only"
        )
    local = total // ep_size
    kept = slice(ep_rank * local, (ep_rank + 1) * local)
    for name in EXPERT_WEIGHTS:
        weight = getattr(experts, name)
        setattr(experts, name, nn.Parameter(weight.detach()[kept].clone(), weight.requires_grad))
    experts.num_experts, experts.first_expert, experts.expert_parallel = local, kept.start, True
    experts.forward = types.MethodType(run_local_experts, experts)


def _shared_output(
    block: nn.Module, layout: MoeLayout, hidden: torch.Tensor
) -> torch.Tensor | None:
    if layout.shared is None:
        return None
    out = getattr(block, layout.shared)(hidden)
    if layout.shared_gate is None:
        return out
    return torch.sigmoid(getattr(block, layout.shared_gate)(hidden)) * out


def patch_forward(
    block: nn.Module, layout: MoeLayout, group: dist.ProcessGroup, config: ExpertParallelConfig
):
    """Route as the family's router does, in ``config.router_dtype`` (the router module
    still runs, so transformers' hooks record its logits), then dispatch to the experts
    over ``group``."""
    gate, dtype, route = (
        getattr(block, layout.router),
        ROUTER_DTYPES[config.router_dtype],
        layout.route,
    )
    gate.forward = types.MethodType(
        lambda self, hidden: route(self, hidden, dtype, config.keep_router_logits), gate
    )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        flat = hidden_states.reshape(-1, hidden_states.shape[-1])
        _, weights, expert_ids = getattr(self, layout.router)(flat)
        out = dispatch_and_combine(getattr(self, layout.experts), flat, weights, expert_ids, group)
        shared = None if config.ignore_shared_experts else _shared_output(self, layout, flat)
        out = out if shared is None else out + shared
        return out.reshape(hidden_states.shape)

    block.forward = types.MethodType(forward, block)


def expert_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The sharded expert weights: each rank holds different ones, so the data-parallel
    strategy must keep them out of its dense gradient averaging (module docstring)."""
    return [
        p
        for m in model.modules()
        if getattr(m, "expert_parallel", False)
        for p in m.parameters(recurse=False)
    ]


def gather_expert_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every expert weight whole (all E experts, as the unsharded model names and shapes
    them), on every rank: what a full checkpoint saves in place of the local shards. A
    collective over the EP and expert FSDP groups: every rank calls it."""
    out = {}
    for name, param in model.named_parameters():
        group = getattr(param, "expert_parallel_group", None)
        if group is None:
            continue
        local = param.full_tensor() if isinstance(param, DTensor) else param
        pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, local.detach().contiguous(), group=group)
        out[name] = torch.cat(pieces).cpu()
    return out


def expert_data_parallel_groups(device_mesh: DeviceMesh) -> list[list[int]]:
    """Ranks holding the same experts: equal ep coordinate (and pp, cp, tp coordinates)."""
    groups: dict[tuple, list[int]] = {}
    for rank in range(device_mesh.world_size):
        c = device_mesh.coords(rank)
        key = (c.get("pp"), c.get("cp"), c.get("tp"), c["ep"])
        groups.setdefault(key, []).append(rank)
    return sorted(groups.values())


def _my_group(groups: list[list[int]]) -> dist.ProcessGroup | None:
    """Create every group (all ranks must call ``new_group`` for each); return ours."""
    mine = None
    for ranks in groups:
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = group
    return mine


def sync_expert_gradients(model: nn.Module) -> None:
    """Without FSDP (DDP over dp alone): reduce each expert gradient over the ranks holding
    the same experts, as DDP reduces the dense ones (which it must not touch: see
    ``expert_parameters``). Like DDP it averages over all ``dp`` ranks, so the wrapper's
    one scale (ranks / global tokens) fits both: summed over the group, divided by ``dp``.
    Call it where DDP reduces, after the last backward before a step."""
    for experts in model.modules():
        if not getattr(experts, "expert_parallel", False) or isinstance(experts, FSDPModule):
            continue
        group, ranks = experts.expert_data_parallel_group, experts.dense_gradient_ranks
        for param in experts.parameters(recurse=False):
            if param.grad is not None:
                if dist.get_world_size(group) > 1:
                    dist.all_reduce(param.grad, group=group)
                param.grad.div_(ranks)


def apply_expert_parallel(
    model: nn.Module, device_mesh: DeviceMesh, config: ExpertParallelConfig | None = None
) -> None:
    """Shard the experts of every MoE block over the mesh's EP groups and patch the blocks'
    forwards. Call before FSDP wraps the model."""
    config = config or ExpertParallelConfig()
    size = device_mesh.size("ep")
    if config.ep_size is not None and config.ep_size != size:
        raise ValueError(
            f"ExpertParallelConfig(ep_size={config.ep_size}) differs from the DeviceMesh's "
            f"ep_size={device_mesh.ep_size}; set it on the mesh (DeviceMesh.from_sizes("
            f"ep_size=...)) and leave the config's as None"
        )
    if not config.enabled or size == 1:
        return
    family = moe_family(model, size)
    layout = family.moe
    blocks = find_moe_blocks(model, family)
    if not blocks:
        raise ValueError(
            f"ep_size={size} needs a mixture-of-experts model, but {type(model).__name__} has "
            f"no {family.name} MoE block (a {layout.router!r} router with fused 3-D "
            f"{layout.experts!r}); drop ep_size from the DeviceMesh for a dense model"
        )
    if layout.route is own_forward and config.router_dtype != "fp32":
        raise ValueError(
            f"the {family.name} router computes in float32 itself; router_dtype="
            f"{config.router_dtype!r} cannot apply: leave router_dtype='fp32'"
        )
    for block in blocks:  # check every block before changing any
        gate, experts = getattr(block, layout.router), getattr(block, layout.experts)
        if hasattr(experts, "base_layer") or hasattr(gate, "base_layer"):
            raise NotImplementedError(
                "a peft adapter wraps the experts or the router, which expert parallel shards "
                "and re-routes; target the other layers, e.g. LoraConfig(target_modules=["
                "'q_proj', 'k_proj', 'v_proj', 'o_proj'])"
            )
        if not hasattr(gate, "top_k") or not hasattr(gate, "weight"):
            raise NotImplementedError(
                f"{type(gate).__name__} is not a top-k router with a weight; the {family.name} "
                "family file must declare a router expert parallel can run"
            )
        total = experts.gate_up_proj.shape[0]
        if total % size:
            raise ValueError(
                f"num_experts={total} is not divisible by ep_size={size}; choose an ep_size "
                f"that divides the number of experts"
            )
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "expert parallel needs torch.distributed: launch with torchrun and call "
            "twinkle.initialize() (or init_process_group) before building the model"
        )
    if dist.get_world_size() != device_mesh.world_size:
        raise ValueError(
            f"the DeviceMesh has {device_mesh.world_size} ranks but torch.distributed has "
            f"{dist.get_world_size()}; size the mesh to the launched processes"
        )
    group, rank = _my_group(device_mesh.group_ranks("ep")), device_mesh.ep_rank
    replicas = _my_group(expert_data_parallel_groups(device_mesh))
    experts = [getattr(block, layout.experts) for block in blocks]
    for block, module in zip(blocks, experts, strict=True):
        shard_experts(module, rank, size)
        module.expert_data_parallel_group = replicas
        module.dense_gradient_ranks = device_mesh.size("dp") * device_mesh.size("fsdp")
        patch_forward(block, layout, group, config)
    if device_mesh.size("fsdp") > 1:  # the dense model will be FSDP-sharded: experts first
        shard_experts_fsdp(experts, device_mesh)
    for param in expert_parameters(model):
        # A global gradient norm adds the squares of the other EP ranks' experts.
        param.expert_parallel_group = group
