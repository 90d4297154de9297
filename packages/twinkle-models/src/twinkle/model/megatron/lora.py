"""LoRA on Megatron's tensor-parallel linears, kept in Hugging Face's per-projection form.

Each targeted Hugging Face projection (q_proj, k_proj, v_proj, o_proj, gate_proj,
up_proj, down_proj; on multi-head latent attention q_a_proj, q_b_proj, kv_a_proj_with_mqa,
kv_b_proj, o_proj) gets its own pair ``A`` (r, in), ``B`` (out, r), with
``delta = scale * B @ A @ x``, exactly peft's LoRA, so the adapter saves under the
names and shapes peft loads onto the Hugging Face model. On Megatron's fused layers
the per-projection deltas are assembled into the fused layout (``linear_qkv``: per
key/value group, its query heads, key, value; ``linear_fc1``: [gate; up]).

Tensor parallelism, per kind of base layer:

* column-parallel (``linear_qkv``, ``linear_fc1``; input replicated, output sharded):
  ``A`` is replicated, ``B`` holds this rank's output rows. The (tokens, r) activation
  ``A x`` passes Megatron's copy region (identity forward, all-reduce backward), so
  ``A``'s gradient and the input's gradient sum every rank's rows.
* row-parallel (``linear_proj``, ``linear_fc2``; input sharded, output all-reduced):
  ``A`` holds this rank's input columns; ``A_r x_r`` is summed over ranks by Megatron's
  reduce region (all-reduce forward, identity backward); ``B`` is replicated.
* under sequence parallel the base layers gather the sequence (column) and reduce-scatter
  it (row); the (tokens, r) activation does the same, and the replicated factor, which
  then sees one slice of the sequence, is marked ``sequence_parallel`` so that
  ``finalize_model_grads`` sums its gradient over the tensor-parallel ranks.

Sharded factors carry Megatron's tensor-parallel attributes, so gradient norms count
them once per shard and replicated ones once. Dropout, when configured, applies to the
input of ``A`` as peft does. The experts and router of a mixture-of-experts model are
adapted in ``lora_experts``, in peft's per-expert form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from twinkle.model.megatron.config import GPTSpec

# Megatron module (after "decoder.layers.<i>.") -> the Hugging Face projections it fuses,
# and whether it is column-parallel
STANDARD_ATTENTION = {
    "self_attention.linear_qkv": (
        ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        True,
    ),
    "self_attention.linear_proj": (("self_attn.o_proj",), False),
}
MLP = {
    "mlp.linear_fc1": (("mlp.gate_proj", "mlp.up_proj"), True),
    "mlp.linear_fc2": (("mlp.down_proj",), False),
}
# Multi-head latent attention (DeepSeek-V3): one Hugging Face projection per Megatron linear.
# megatron-core's local layers split the down-projections' outputs over tp as well (and
# gather them back), so every one but the output is column-parallel.
LATENT_ATTENTION = {
    "self_attention.linear_q_proj": (("self_attn.q_proj",), True),
    "self_attention.linear_q_down_proj": (("self_attn.q_a_proj",), True),
    "self_attention.linear_q_up_proj": (("self_attn.q_b_proj",), True),
    "self_attention.linear_kv_down_proj": (("self_attn.kv_a_proj_with_mqa",), True),
    "self_attention.linear_kv_up_proj": (("self_attn.kv_b_proj",), True),
    "self_attention.linear_proj": (("self_attn.o_proj",), False),
}
FUSED = {**STANDARD_ATTENTION, **LATENT_ATTENTION, **MLP}


def _short_names(table: dict) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.split(".")[-1] for ps, _ in table.values() for p in ps))


PROJECTIONS = _short_names({**STANDARD_ATTENTION, **MLP})
LATENT_PROJECTIONS = _short_names({**LATENT_ATTENTION, **MLP})
# Each projection's place in the seed of its A's init (the standard ones first, as before).
SEED_ORDER = (*PROJECTIONS, *(p for p in LATENT_PROJECTIONS if p not in PROJECTIONS))


def projections_of(spec: GPTSpec) -> tuple[str, ...]:
    """The Hugging Face projections MegatronModel's LoRA adapts on this model."""
    return LATENT_PROJECTIONS if spec.mla else PROJECTIONS


@dataclass(frozen=True)
class LoraSettings:
    """What the LoRA layers need from a peft LoraConfig (as peft applies it to the model:
    ``lora_experts.peft_config_for``)."""

    r: int
    scale: float
    dropout: float
    targets: tuple[str, ...]  # short Hugging Face names, e.g. ('q_proj', 'v_proj')
    expert_targets: tuple[str, ...] = ()  # 'gate_up_proj', 'down_proj' (Qwen3-MoE experts)
    router: bool = False  # the MoE router's gate.weight
    lora_alpha: float = 0.0
    use_rslora: bool = False
    rank_pattern: tuple[tuple[str, int], ...] = ()
    alpha_pattern: tuple[tuple[str, float], ...] = ()

    @classmethod
    def from_peft(cls, config, projections: tuple[str, ...] = PROJECTIONS) -> LoraSettings:
        """``projections``: what the model's LoRA can adapt (``projections_of(spec)``)."""
        from twinkle.model.megatron.lora_experts import parse_target_parameters

        unsupported = {
            "use_dora": "DoRA",
            "bias": "LoRA biases",
            "modules_to_save": "modules_to_save",
            "layers_to_transform": "layers_to_transform",
        }
        for field, what in unsupported.items():
            value = getattr(config, field, None)
            if value not in (None, False, "none"):
                raise ValueError(f"{what} is not supported by MegatronModel's LoRA")
        expert_targets, router = parse_target_parameters(getattr(config, "target_parameters", None))
        targets = config.target_modules
        if targets is None and not (expert_targets or router):
            raise ValueError(
                "LoraConfig.target_modules is None: name the projections to adapt "
                f"({', '.join(projections)}) or pass 'all-linear'"
            )
        if targets in ("all-linear", "all_linear"):
            names = projections
        else:
            if targets is None:
                requested = set()
            else:
                requested = {targets} if isinstance(targets, str) else set(targets)
            names = tuple(p for p in projections if p in requested)
            unknown = sorted(requested - set(projections))
            if unknown or not (names or expert_targets or router):
                raise ValueError(
                    f"LoRA target_modules {sorted(requested)}: MegatronModel adapts "
                    f"{', '.join(projections)} (or 'all-linear'); {unknown or 'none'} "
                    "cannot be targeted"
                )
        if (expert_targets or router) and config.lora_dropout:
            raise ValueError(
                f"lora_dropout={config.lora_dropout} with LoRA on experts or the router: peft "
                "adapts those as parameters, which it allows only without dropout; set "
                "lora_dropout=0.0"
            )
        r = config.r
        scale = config.lora_alpha / (math.sqrt(r) if config.use_rslora else r)
        return cls(
            r=r,
            scale=scale,
            dropout=config.lora_dropout,
            targets=names,
            expert_targets=expert_targets,
            router=router,
            lora_alpha=config.lora_alpha,
            use_rslora=bool(config.use_rslora),
            rank_pattern=tuple(sorted((config.rank_pattern or {}).items())),
            alpha_pattern=tuple(sorted((config.alpha_pattern or {}).items())),
        )

    def rank_and_scale(self, key: str) -> tuple[int, float]:
        """r and scale of the Hugging Face module or parameter ``key``, with peft's rank and
        alpha patterns (how peft gives the fused expert gate_up tensor rank 2r)."""
        from peft.utils.other import get_pattern_key

        ranks, alphas = dict(self.rank_pattern), dict(self.alpha_pattern)
        r = ranks.get(get_pattern_key(list(ranks), key), self.r)
        alpha = alphas.get(get_pattern_key(list(alphas), key), self.lora_alpha)
        return r, alpha / (math.sqrt(r) if self.use_rslora else r)


def _shard_attributes(param: nn.Parameter, dim: int | None) -> None:
    from megatron.core.tensor_parallel.layers import (
        set_defaults_if_not_set_tensor_model_parallel_attributes,
        set_tensor_model_parallel_attributes,
    )

    if dim is None:
        set_defaults_if_not_set_tensor_model_parallel_attributes(param)
    else:
        set_tensor_model_parallel_attributes(param, True, dim, 1)


class LoraParallelLinear(nn.Module):
    """A Megatron parallel linear plus one LoRA pair per fused Hugging Face projection.

    ``out_rows`` are the output rows of each projection on this rank (column-parallel)
    and ``in_features`` the input width on this rank; ``assemble`` turns the projections'
    deltas into the base layer's output layout.
    """

    def __init__(
        self,
        base: nn.Module,
        projections: dict[str, int],
        in_features: int,
        out_features: int,
        column_parallel: bool,
        settings: LoraSettings,
        assemble,
    ) -> None:
        super().__init__()
        self.base = base
        self.column_parallel = column_parallel
        self.scale = settings.scale
        self.assemble = assemble
        self.dropout = nn.Dropout(settings.dropout) if settings.dropout else nn.Identity()
        dtype = next(base.parameters()).dtype
        device = next(base.parameters()).device
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        for name, rows in projections.items():
            a = nn.Parameter(torch.zeros(settings.r, in_features, dtype=dtype, device=device))
            b_rows = rows if column_parallel else out_features
            b = nn.Parameter(torch.zeros(b_rows, settings.r, dtype=dtype, device=device))
            _shard_attributes(a, None if column_parallel else 1)
            _shard_attributes(b, 0 if column_parallel else None)
            # the replicated factor sees this rank's slice of the sequence only
            (a if column_parallel else b).sequence_parallel = self.sequence_parallel
            self.lora_A[name], self.lora_B[name] = a, b

    @property
    def sequence_parallel(self) -> bool:
        return bool(getattr(self.base, "sequence_parallel", False))

    def forward(self, x: torch.Tensor, *args, **kwargs):
        from megatron.core.tensor_parallel import (
            copy_to_tensor_model_parallel_region,
            gather_from_sequence_parallel_region,
            reduce_from_tensor_model_parallel_region,
            reduce_scatter_to_sequence_parallel_region,
        )

        output, bias = self.base(x, *args, **kwargs)
        x = self.dropout(x)
        deltas = {}
        for name, a in self.lora_A.items():
            hidden = x @ a.t()
            if self.column_parallel and self.sequence_parallel:
                hidden = gather_from_sequence_parallel_region(hidden)
            elif self.column_parallel:
                hidden = copy_to_tensor_model_parallel_region(hidden)
            elif self.sequence_parallel:
                hidden = reduce_scatter_to_sequence_parallel_region(hidden)
            else:
                hidden = reduce_from_tensor_model_parallel_region(hidden)
            deltas[name] = (hidden @ self.lora_B[name].t()) * self.scale
        return output + self.assemble(deltas, output), bias


def _qkv_assembler(spec: GPTSpec, tp: int):
    """Per-projection deltas -> linear_qkv's grouped layout (zeros for untargeted ones)."""
    groups = spec.num_kv_heads // tp
    d, per_group = spec.head_dim, spec.heads_per_group

    def assemble(deltas: dict, like: torch.Tensor) -> torch.Tensor:
        lead = like.shape[:-1]
        parts = []
        for name, width in (("q_proj", per_group * d), ("k_proj", d), ("v_proj", d)):
            delta = deltas.get(name)
            if delta is None:
                delta = like.new_zeros(*lead, groups * width)
            parts.append(delta.reshape(*lead, groups, width))
        return torch.cat(parts, dim=-1).reshape(like.shape)

    return assemble


def _fc1_assembler(spec: GPTSpec, tp: int):
    width = spec.ffn_hidden_size // tp

    def assemble(deltas: dict, like: torch.Tensor) -> torch.Tensor:
        lead = like.shape[:-1]
        zeros = like.new_zeros(*lead, width)
        gate, up = deltas.get("gate_proj"), deltas.get("up_proj")
        return torch.cat([zeros if gate is None else gate, zeros if up is None else up], dim=-1)

    return assemble


def _single(deltas: dict, like: torch.Tensor) -> torch.Tensor:
    return next(iter(deltas.values()))


def _layer_shapes(spec: GPTSpec, tp: int) -> dict[str, tuple[dict[str, int], int, int, object]]:
    """Megatron module -> (rows per projection on this rank, in, out, assembler)."""
    h, d = spec.hidden_size, spec.head_dim
    ffn = spec.ffn_hidden_size // tp
    mlp = {
        "mlp.linear_fc1": (
            {"gate_proj": ffn, "up_proj": ffn},
            h,
            2 * ffn,
            _fc1_assembler(spec, tp),
        ),
        "mlp.linear_fc2": ({"down_proj": h}, ffn, h, _single),
    }
    if spec.mla:
        return {**_latent_shapes(spec, tp), **mlp}
    q_rows, kv_rows = spec.num_heads * d // tp, spec.num_kv_heads * d // tp
    return {
        "self_attention.linear_qkv": (
            {"q_proj": q_rows, "k_proj": kv_rows, "v_proj": kv_rows},
            h,
            q_rows + 2 * kv_rows,
            _qkv_assembler(spec, tp),
        ),
        "self_attention.linear_proj": ({"o_proj": h}, spec.num_heads * d // tp, h, _single),
        **mlp,
    }


def _latent_shapes(spec: GPTSpec, tp: int) -> dict[str, tuple[dict[str, int], int, int, object]]:
    """Latent attention's linears: (input width, full output width) of each, the output split
    over tp but for linear_proj's, whose input is."""
    mla, h, heads = spec.mla, spec.hidden_size, spec.num_heads
    query = heads * (mla["qk_head_dim"] + mla["qk_pos_emb_head_dim"])
    widths = {
        "self_attention.linear_q_proj": (h, query),
        "self_attention.linear_q_down_proj": (h, mla["q_lora_rank"] or 0),
        "self_attention.linear_q_up_proj": (mla["q_lora_rank"] or 0, query),
        "self_attention.linear_kv_down_proj": (h, mla["kv_lora_rank"] + mla["qk_pos_emb_head_dim"]),
        "self_attention.linear_kv_up_proj": (
            mla["kv_lora_rank"],
            heads * (mla["qk_head_dim"] + mla["v_head_dim"]),
        ),
    }
    shapes = {
        path: ({LATENT_ATTENTION[path][0][0].split(".")[-1]: out // tp}, in_, out // tp, _single)
        for path, (in_, out) in widths.items()
    }
    values = heads * mla["v_head_dim"] // tp
    shapes["self_attention.linear_proj"] = ({"o_proj": h}, values, h, _single)
    return shapes


def inject_lora(
    gpt_model: nn.Module,
    spec: GPTSpec,
    settings: LoraSettings,
    tp: int,
    tp_rank: int,
    seed: int,
    config=None,
) -> None:
    """Freeze the model and wrap its targeted linears with LoRA layers (B = 0, A random);
    experts and the router of a mixture-of-experts model as ``lora_experts`` does.

    ``A`` is drawn in full from ``seed`` (the same on every rank) and cut to this rank's
    shard, so a model's LoRA init does not depend on the tensor-parallel size.
    """
    from twinkle.model.megatron.lora_experts import inject_expert_lora

    _check_dense_ranks(spec, settings)
    if (settings.expert_targets or settings.router) and not spec.num_experts:
        raise ValueError(
            f"LoRA target_parameters name experts or a router ({settings.expert_targets}, "
            f"router={settings.router}) but this {spec.model_type} model has none; target its "
            "projections with target_modules"
        )
    for param in gpt_model.parameters():
        param.requires_grad_(False)
    shapes = _layer_shapes(spec, tp)
    for layer in gpt_model.decoder.layers:
        global_layer = layer.layer_number - 1
        for path, (projections, column_parallel) in FUSED.items():
            wanted = {p.split(".")[-1] for p in projections} & set(settings.targets)
            if not wanted or _submodule_or_none(layer, path) is None:
                continue
            rows, in_features, out_features, assemble = shapes[path]
            parent_path, attr = path.rsplit(".", 1)
            parent = layer.get_submodule(parent_path)
            wrapper = LoraParallelLinear(
                getattr(parent, attr),
                {name: rows[name] for name in rows if name in wanted},
                in_features,
                out_features,
                column_parallel,
                settings,
                assemble,
            )
            for name, a in wrapper.lora_A.items():
                full_in = in_features if column_parallel else in_features * tp
                full = torch.empty(settings.r, full_in)
                layer_generator = torch.Generator().manual_seed(
                    seed * 1_000_003 + global_layer * 101 + SEED_ORDER.index(name)
                )
                nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=layer_generator)
                shard = full if column_parallel else full.chunk(tp, dim=1)[tp_rank]
                with torch.no_grad():
                    a.copy_(shard)
            setattr(parent, attr, wrapper)
    if settings.expert_targets or settings.router:
        inject_expert_lora(gpt_model, settings, config, seed)


def _check_dense_ranks(spec: GPTSpec, settings: LoraSettings) -> None:
    """The projections' LoRA has one r and scale; refuse rank or alpha patterns that would
    give a projection others (peft would train something else)."""
    for layer in range(spec.num_layers):
        for projections, _ in FUSED.values():
            for projection in projections:
                if projection.split(".")[-1] not in settings.targets:
                    continue
                key = f"model.layers.{layer}.{projection}"
                if settings.rank_and_scale(key) != (settings.r, settings.scale):
                    raise ValueError(
                        f"rank_pattern/alpha_pattern give {key} another r or alpha: "
                        "MegatronModel's LoRA uses one r and lora_alpha for the projections"
                    )


def _submodule_or_none(module: nn.Module, path: str) -> nn.Module | None:
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None


def lora_modules(gpt_model: nn.Module):
    """(global layer, Megatron module path, LoraParallelLinear) for every LoRA layer."""
    for layer in gpt_model.decoder.layers:
        for path in FUSED:
            # a mixture-of-experts layer has no mlp.linear_fc1/fc2
            module = _submodule_or_none(layer, path)
            if isinstance(module, LoraParallelLinear):
                yield layer.layer_number - 1, path, module


def hf_prefix(global_layer: int, path: str, projection: str) -> str:
    """peft's saved-name prefix of one projection's LoRA pair."""
    hf_path = next(p for p in FUSED[path][0] if p.endswith(projection))
    return f"base_model.model.model.layers.{global_layer}.{hf_path}"


@torch.no_grad()
def gather_lora(gpt_model: nn.Module, tp_group) -> dict[str, torch.Tensor]:
    """This stage's LoRA weights under peft's names, full (tensor- and expert-parallel
    gathered)."""
    import torch.distributed as dist

    from twinkle.model.megatron.lora_experts import gather_expert_lora

    tp = dist.get_world_size(tp_group)
    out = {}
    for layer, path, module in lora_modules(gpt_model):
        for name in module.lora_A:
            a, b = module.lora_A[name].detach(), module.lora_B[name].detach()
            sharded, dim = (b, 0) if module.column_parallel else (a, 1)
            pieces = [torch.empty_like(sharded) for _ in range(tp)]
            if tp > 1:
                dist.all_gather(pieces, sharded.contiguous(), group=tp_group)
            else:
                pieces = [sharded]
            full = torch.cat(pieces, dim=dim)
            a, b = (a, full) if module.column_parallel else (full, b)
            prefix = hf_prefix(layer, path, name)
            out[f"{prefix}.lora_A.weight"] = a.cpu().clone()
            out[f"{prefix}.lora_B.weight"] = b.cpu().clone()
    out.update(gather_expert_lora(gpt_model))
    return out


@torch.no_grad()
def load_lora(
    gpt_model: nn.Module, weights: dict[str, torch.Tensor], tp: int, tp_rank: int
) -> None:
    """Fill the LoRA layers from peft-named full weights, cutting this rank's shards."""
    from twinkle.model.megatron.lora_experts import load_expert_lora

    load_expert_lora(gpt_model, weights)
    for layer, path, module in lora_modules(gpt_model):
        for name in module.lora_A:
            prefix = hf_prefix(layer, path, name)
            missing = [k for k in ("A", "B") if f"{prefix}.lora_{k}.weight" not in weights]
            if missing:
                raise ValueError(f"the adapter has no {prefix}.lora_{missing[0]}.weight")
            a, b = weights[f"{prefix}.lora_A.weight"], weights[f"{prefix}.lora_B.weight"]
            if module.column_parallel:
                b = b.chunk(tp, dim=0)[tp_rank]
            else:
                a = a.chunk(tp, dim=1)[tp_rank]
            for target, value in ((module.lora_A[name], a), (module.lora_B[name], b)):
                if target.shape != value.shape:
                    raise ValueError(
                        f"{prefix}: the adapter's shard has shape {tuple(value.shape)}, the "
                        f"model's {tuple(target.shape)}: it was trained with another r or model"
                    )
                target.copy_(value)


def merged_hf_weights(
    weights: dict[str, torch.Tensor], lora: dict[str, torch.Tensor], settings: LoraSettings
) -> dict[str, torch.Tensor]:
    """Hugging Face weights with every LoRA pair merged in: ``W + scale * B @ A`` (per expert
    for the fused expert tensors)."""
    from twinkle.model.megatron.lora_experts import merge_expert_lora

    merged = dict(weights)
    lora = merge_expert_lora(merged, lora, settings)
    prefix = "base_model.model."
    for key, a in lora.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[len(prefix) : -len(".lora_A.weight")]
        b = lora[key.replace(".lora_A.", ".lora_B.")]
        base = merged[f"{module}.weight"]
        # the router (``mlp.gate``) is adapted as a parameter, the projections as modules
        pattern_key = f"{module}.weight" if module.endswith(".gate") else module
        _, scale = settings.rank_and_scale(pattern_key)
        merged[f"{module}.weight"] = (base.float() + scale * (b.float() @ a.float())).to(base.dtype)
    return merged
