"""Hugging Face <-> Megatron weights for GPT-style models, one tensor-parallel shard at a time.

Each Megatron parameter of a rank is built from the Hugging Face tensors it
covers, cut to that rank's shard, so a rank reads only what it holds (with a
safetensors folder, only those tensors are read from disk). Export runs the
other way: the tensor-parallel shards are gathered and split back into the
Hugging Face tensors, bit for bit.

Which Hugging Face tensors make which Megatron parameter is each family's
``MegatronRules.weights`` (``twinkle.model.families``); this module knows the layouts.

Layouts (per layer; G key/value groups, h query heads per group, d head dim):

* ``linear_qkv`` stacks, for each group, its h query heads, then its key, then its
  value: (G·(h+2)·d, H); tensor parallel splits whole groups.
* ``linear_fc1`` is [gate; up]; each tensor-parallel rank holds [gate_r; up_r].
* ``qkv_fused`` and ``fc1_fused`` are the same two layouts read from one Hugging Face
  tensor that stacks [q; k; v] or [gate; up] (Phi-3).
* ``linear_proj`` and ``linear_fc2`` are row-parallel (split along the input dim);
  ``column`` layers split their outputs (MLA's projections).
* embedding and output rows are padded to the padded vocabulary, then split.
* norms are replicated.
* experts (Qwen3-MoE) are spread over expert-parallel ranks, each split like a dense MLP
  (fc1 column-, fc2 row-parallel) over the expert-tensor-parallel ranks; the router is
  replicated.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import torch

from twinkle.model.megatron.config import GPTSpec

# Experts: Megatron's local expert j of expert-parallel rank r is global expert
# r * (E / ep) + j; Hugging Face (transformers 5) fuses them into (E, 2I, H) and (E, H, I).
EXPERT = re.compile(
    r"decoder\.layers\.(\d+)\.mlp\.experts\.local_experts\.(\d+)\.linear_fc([12])\.weight"
)
EXPERT_TENSORS = {
    "1": ("gate_up_proj", ("gate_proj", "up_proj")),
    "2": ("down_proj", ("down_proj",)),
}
EMBEDDING = "model.embed_tokens.weight"
GLOBAL_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "embedding.word_embeddings.weight": ("vocab", (EMBEDDING,)),
    "decoder.final_layernorm.weight": ("copy", ("model.norm.weight",)),
    "output_layer.weight": ("vocab", ("lm_head.weight",)),
}


def hf_names_of(name: str, layer_of: dict[int, int], spec: GPTSpec) -> tuple[str, tuple[str, ...]]:
    """The layout kind and the Hugging Face tensors behind the Megatron parameter ``name``.

    ``layer_of`` maps the stage's local layer index to the global one (pipeline stages
    number their layers from 0).
    """
    if name.startswith("decoder.layers."):
        local, rest = name[len("decoder.layers.") :].split(".", 1)
        if rest not in spec.weights:
            raise KeyError(
                f"no conversion rule for Megatron parameter {name!r} in the {spec.model_type} "
                "family's MegatronRules.weights"
            )
        kind, names = spec.weights[rest]
        prefix = f"model.layers.{layer_of[int(local)]}."
        return kind, tuple(prefix + n for n in names)
    if name not in GLOBAL_RULES:
        raise KeyError(f"no conversion rule for Megatron parameter {name!r}")
    kind, names = GLOBAL_RULES[name]
    if name == "output_layer.weight" and spec.tie_embeddings:
        names = (EMBEDDING,)
    return kind, names


def _unfused(kind: str, tensors: list[torch.Tensor], spec: GPTSpec | None):
    """A fused Hugging Face tensor's parts: ``qkv_fused`` -> [q, k, v], ``fc1_fused`` ->
    [gate, up]; other kinds unchanged."""
    if kind == "qkv_fused":
        d = spec.head_dim
        sizes = [spec.num_heads * d, spec.num_kv_heads * d, spec.num_kv_heads * d]
        return "qkv", list(tensors[0].split(sizes))
    if kind == "fc1_fused":
        return "fc1", list(tensors[0].chunk(2))
    return kind, tensors


def to_shard(kind: str, tensors: list[torch.Tensor], spec: GPTSpec | None, rank: int, tp: int):
    """Tensor-parallel shard ``rank`` of ``tp`` of the Megatron parameter built from ``tensors``."""
    kind, tensors = _unfused(kind, tensors, spec)
    if kind == "copy":
        return tensors[0]
    if kind == "row":
        return tensors[0].chunk(tp, dim=1)[rank]
    if kind == "column":
        return tensors[0].chunk(tp)[rank]
    if kind == "vocab":
        full = tensors[0]
        padding = spec.padded_vocab_size - full.shape[0]
        if padding:
            full = torch.cat([full, full.new_zeros(padding, *full.shape[1:])])
        return full.chunk(tp)[rank]
    if kind == "fc1":
        gate, up = tensors
        return torch.cat([gate.chunk(tp)[rank], up.chunk(tp)[rank]])
    if kind == "qkv":
        q, k, v = tensors
        groups, per_group, d = spec.num_kv_heads, spec.heads_per_group, spec.head_dim
        rest = q.shape[1:]
        grouped = torch.cat(
            [
                q.reshape(groups, per_group * d, *rest),
                k.reshape(groups, d, *rest),
                v.reshape(groups, d, *rest),
            ],
            dim=1,
        )
        return grouped.chunk(tp)[rank].reshape(-1, *rest)
    raise ValueError(f"unknown layout kind {kind!r}")


def from_shards(kind: str, shards: list[torch.Tensor], spec: GPTSpec | None) -> list[torch.Tensor]:
    """The Hugging Face tensors of one Megatron parameter, from all its tensor-parallel shards."""
    if kind in ("qkv_fused", "fc1_fused"):
        return [torch.cat(from_shards(kind.removesuffix("_fused"), shards, spec))]
    if kind == "copy":
        return [shards[0]]
    if kind == "row":
        return [torch.cat(shards, dim=1)]
    if kind == "column":
        return [torch.cat(shards)]
    if kind == "vocab":
        return [torch.cat(shards)[: spec.vocab_size]]
    if kind == "fc1":
        halves = [s.chunk(2) for s in shards]
        return [torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])]
    if kind == "qkv":
        full = torch.cat(shards)
        groups, per_group, d = spec.num_kv_heads, spec.heads_per_group, spec.head_dim
        rest = full.shape[1:]
        grouped = full.reshape(groups, (per_group + 2) * d, *rest)
        q, k, v = grouped.split([per_group * d, d, d], dim=1)
        return [t.reshape(-1, *rest) for t in (q, k, v)]
    raise ValueError(f"unknown layout kind {kind!r}")


def local_layer_map(gpt_model: torch.nn.Module) -> dict[int, int]:
    """Local layer index -> global (0-based) layer index, for this pipeline stage."""
    return {i: layer.layer_number - 1 for i, layer in enumerate(gpt_model.decoder.layers)}


CONVERTED_BUFFERS = ("expert_bias",)
"""Buffers that are Hugging Face weights too (the router's load-balancing bias)."""


def megatron_parameters(gpt_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The bare GPTModel's base parameters by name, with the buffers that are weights:
    LoRA factors left out, and a LoRA wrapper's ``.base`` dropped from its base layer's
    names."""
    buffers = [
        (name, buffer)
        for name, buffer in gpt_model.named_buffers()
        if name.rsplit(".", 1)[-1] in CONVERTED_BUFFERS
    ]
    return {
        name.replace(".base.", "."): param
        for name, param in [*gpt_model.named_parameters(), *buffers]
        if ".lora_" not in name
    }


@torch.no_grad()
def load_hf_weights(
    gpt_model: torch.nn.Module,
    spec: GPTSpec,
    read: Callable[[str], torch.Tensor],
    tp_rank: int,
    tp: int,
) -> None:
    """Fill every parameter of this rank's GPTModel from Hugging Face tensors (``read(name)``)."""
    layer_of = local_layer_map(gpt_model)
    for name, param in megatron_parameters(gpt_model).items():
        expert = EXPERT.fullmatch(name)
        if expert:
            whole = _read_expert(read, expert, layer_of, _global_expert(spec, int(expert[2])))
            shard = _expert_shard(whole, expert[3])
        else:
            kind, hf_names = hf_names_of(name, layer_of, spec)
            shard = to_shard(kind, [read(n) for n in hf_names], spec, tp_rank, tp)
        if shard.shape != param.shape:
            raise ValueError(
                f"{name}: the converted shard has shape {tuple(shard.shape)} but the Megatron "
                f"parameter has {tuple(param.shape)}; the checkpoint does not match its config"
            )
        param.copy_(shard)


@torch.no_grad()
def gather_hf_weights(
    gpt_model: torch.nn.Module, spec: GPTSpec, tp_group
) -> dict[str, torch.Tensor]:
    """This pipeline stage's weights as full Hugging Face tensors (tensor-parallel gathered).

    Every rank of the tensor-parallel group returns the same dict. The tied output
    layer of the last stage is left out (the embedding is the Hugging Face tensor).
    """
    import torch.distributed as dist

    layer_of = local_layer_map(gpt_model)
    tp = dist.get_world_size(tp_group)
    out: dict[str, torch.Tensor] = {}
    experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for name, param in megatron_parameters(gpt_model).items():
        if name == "output_layer.weight" and spec.tie_embeddings:
            continue
        expert = EXPERT.fullmatch(name)
        if expert:
            key = (layer_of[int(expert[1])], expert[3])
            experts.setdefault(key, {})[int(expert[2])] = _whole_expert(param.detach(), expert[3])
            continue
        kind, hf_names = hf_names_of(name, layer_of, spec)
        data = param.detach().contiguous()
        shards = [torch.empty_like(data) for _ in range(tp)]
        if tp > 1 and kind != "copy":
            dist.all_gather(shards, data, group=tp_group)
        else:
            shards = [data]
        for hf_name, tensor in zip(hf_names, from_shards(kind, shards, spec), strict=True):
            out[hf_name] = tensor.cpu().clone()
    out.update(_gather_experts(experts))
    return out


def _global_expert(spec: GPTSpec, local: int) -> int:
    from megatron.core import parallel_state

    ep_rank = parallel_state.get_expert_model_parallel_rank()
    ep = parallel_state.get_expert_model_parallel_world_size()
    return ep_rank * (spec.num_experts // ep) + local


def _expert_shard(whole: torch.Tensor, which: str) -> torch.Tensor:
    """This expert-tensor-parallel rank's shard of one expert's fc1 ([gate; up]) or fc2."""
    from megatron.core import parallel_state

    etp = parallel_state.get_expert_tensor_parallel_world_size()
    rank = parallel_state.get_expert_tensor_parallel_rank()
    if which == "2":
        return to_shard("row", [whole], None, rank, etp)
    return to_shard("fc1", list(whole.chunk(2)), None, rank, etp)


def _whole_expert(shard: torch.Tensor, which: str) -> torch.Tensor:
    """One expert's fc1 or fc2, gathered over the expert-tensor-parallel ranks."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    group = parallel_state.get_expert_tensor_parallel_group()
    etp = dist.get_world_size(group)
    if etp == 1:
        return shard
    shards = [torch.empty_like(shard) for _ in range(etp)]
    dist.all_gather(shards, shard.contiguous(), group=group)
    if which == "2":
        return from_shards("row", shards, None)[0]
    return torch.cat(from_shards("fc1", shards, None))


def _read_expert(read, match, layer_of: dict[int, int], index: int) -> torch.Tensor:
    """One expert's fc1 ([gate; up]) or fc2, from fused or per-expert Hugging Face tensors."""
    prefix = f"model.layers.{layer_of[int(match[1])]}.mlp.experts."
    fused, per_expert = EXPERT_TENSORS[match[3]]
    try:
        return read(prefix + fused)[index]
    except KeyError:
        return torch.cat([read(f"{prefix}{index}.{n}.weight") for n in per_expert])


def _gather_experts(experts: dict) -> dict[str, torch.Tensor]:
    """Each layer's fused expert tensors, local experts gathered over expert-parallel ranks."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    out = {}
    if not experts:
        return out
    group = parallel_state.get_expert_model_parallel_group()
    ep = dist.get_world_size(group)
    for (layer, which), local in sorted(experts.items()):
        stacked = torch.stack([local[j] for j in sorted(local)]).contiguous()
        pieces = [torch.empty_like(stacked) for _ in range(ep)]
        if ep > 1:
            dist.all_gather(pieces, stacked, group=group)
        else:
            pieces = [stacked]
        fused = EXPERT_TENSORS[which][0]
        out[f"model.layers.{layer}.mlp.experts.{fused}"] = torch.cat(pieces).cpu().clone()
    return out


class HFWeightReader:
    """Reads named tensors of a Hugging Face model, from a safetensors folder or a state dict.

    A folder is read lazily, one tensor at a time, so a rank never loads weights it
    does not hold. A tied ``lm_head.weight`` falls back to the embedding.
    """

    def __init__(self, folder: Path | None = None, state_dict: dict | None = None) -> None:
        self.state_dict = state_dict
        self.files: dict[str, Path] = {}
        if folder is not None:
            folder = Path(folder)
            index = folder / "model.safetensors.index.json"
            if index.is_file():
                weight_map = json.loads(index.read_text())["weight_map"]
                self.files = {n: folder / f for n, f in weight_map.items()}
            else:
                from safetensors import safe_open

                for file in sorted(folder.glob("*.safetensors")):
                    with safe_open(file, "pt") as handle:
                        self.files.update({n: file for n in handle.keys()})  # noqa: SIM118
            if not self.files:
                raise ValueError(f"{folder} holds no safetensors weights MegatronModel can read")

    def __call__(self, name: str) -> torch.Tensor:
        if self.state_dict is not None:
            if name not in self.state_dict and name == "lm_head.weight":
                name = EMBEDDING
            return self.state_dict[name]
        if name not in self.files:
            if name == "lm_head.weight" and EMBEDDING in self.files:
                return self(EMBEDDING)
            raise KeyError(f"the checkpoint has no tensor {name!r}")
        from safetensors import safe_open

        with safe_open(self.files[name], "pt") as handle:
            return handle.get_tensor(name)


def write_hf_folder(
    weights: dict[str, torch.Tensor],
    hf_config,
    folder: str | os.PathLike,
    stage: int,
    stages: int,
    writer: bool,
    names_by_stage: list[list[str]],
) -> None:
    """Write one pipeline stage's shard file; stage 0's writer adds the index and config.

    ``names_by_stage`` lists the tensor names each stage writes (gathered beforehand),
    so the index is complete without any rank holding every tensor.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    file = f"model-{stage + 1:05d}-of-{stages:05d}.safetensors"
    if writer:
        save_file({k: v.contiguous() for k, v in weights.items()}, folder / file, {"format": "pt"})
    if writer and stage == 0:
        weight_map = {
            name: f"model-{s + 1:05d}-of-{stages:05d}.safetensors"
            for s, names in enumerate(names_by_stage)
            for name in names
        }
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        hf_config.save_pretrained(folder)
