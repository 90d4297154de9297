"""Expert-parallel weights and optimizer state in and out of one Hugging Face folder.

Under expert parallel each rank holds ``E/ep`` of the fused experts. A checkpoint folder
holds all of them whole (``gather_expert_weights``), in the layout ``save_pretrained``
writes: transformers splits the fused ``gate_up_proj (E, 2I, H)`` / ``down_proj (E, H, I)``
into ``experts.<e>.gate_proj / up_proj / down_proj`` per expert, so reading a folder fuses
them back (``fuse_expert_weights``) and each rank keeps its own experts
(``local_expert_weights``). The folder is thus a plain Hugging Face folder, loadable on
any mesh or none.

The optimizer state of the experts differs across EP ranks under the same parameter name,
which torch.distributed.checkpoint would take for one replicated tensor and write once:
``qualify_expert_keys`` names each EP rank's expert entries apart before saving and
loading (so a resume needs the ep_size it was saved with).
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

_PER_EXPERT = re.compile(
    r"^(?P<prefix>.+\.experts)\.(?P<index>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$"
)


def uses_expert_parallel(model: nn.Module) -> bool:
    """Whether ``apply_expert_parallel`` sharded the experts of ``model``."""
    return any(getattr(m, "expert_parallel", False) for m in model.modules())


def fuse_expert_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` with per-expert ``gate_proj/up_proj/down_proj`` tensors (as
    ``save_pretrained`` writes them) stacked into the fused in-memory parameters."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, tensor in weights.items():
        match = _PER_EXPERT.match(name)
        if match is None:
            out[name] = tensor
            continue
        projections = experts.setdefault(match["prefix"], {})
        projections.setdefault(match["proj"], {})[int(match["index"])] = tensor
    for prefix, projections in experts.items():
        count = len(projections["down_proj"])
        out[f"{prefix}.gate_up_proj"] = torch.stack(
            [
                torch.cat([projections["gate_proj"][e], projections["up_proj"][e]])
                for e in range(count)
            ]
        )
        out[f"{prefix}.down_proj"] = torch.stack(
            [projections["down_proj"][e] for e in range(count)]
        )
    return out


def _expert_modules(model: nn.Module) -> dict[str, nn.Module]:
    return {
        name: module
        for name, module in model.named_modules()
        if getattr(module, "expert_parallel", False)
    }


def local_expert_weights(
    model: nn.Module, weights: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``weights`` (all experts whole) with each expert tensor cut to this rank's experts."""
    out = dict(weights)
    for prefix, module in _expert_modules(model).items():
        kept = slice(module.first_expert, module.first_expert + module.num_experts)
        for name, _ in module.named_parameters(recurse=False):
            key = f"{prefix}.{name}"
            if key in out:
                out[key] = out[key][kept]
    return out


def qualify_expert_keys(model: nn.Module, state: dict[str, Any], *, undo: bool = False) -> None:
    """Rename, in place, the expert entries of an optimizer state dict (``get_optimizer_
    state_dict``'s, keyed by parameter name) to ``<name>@ep<rank>``, or back with ``undo``."""
    renames = {}
    for prefix, module in _expert_modules(model).items():
        for name, param in module.named_parameters(recurse=False):
            key = f"{prefix}.{name}"
            tagged = f"{key}@ep{dist.get_rank(param.expert_parallel_group)}"
            renames[key] = tagged
    if undo:
        renames = {tagged: key for key, tagged in renames.items()}
    slots = state["state"]
    for old, new in renames.items():
        if old in slots:
            slots[new] = slots.pop(old)
    for group in state["param_groups"]:
        group["params"] = [renames.get(name, name) for name in group["params"]]
