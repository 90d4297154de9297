"""``kernelize(model)``: route a Hugging Face model's layers through the registry's fast paths.

By class, where the model's own code computes exactly what an op's reference does:

- Llama-style RMSNorm layers (Llama, Qwen2, Qwen3, Qwen3-MoE, Mistral, Mixtral) -> ``rms_norm``;
- MLPs with ``gate_proj``/``up_proj``/``down_proj`` and a SiLU activation -> ``swiglu``;
- MoE expert stacks with fused 3-D ``gate_up_proj``/``down_proj`` and SiLU (Qwen3-MoE,
  Qwen2-MoE, Mixtral) -> ``grouped_matmul`` (tokens sorted by expert, one kernel per
  projection);
- the attention of those families -> ``rotary_embedding``. transformers calls its
  ``apply_rotary_pos_emb`` as a function of the modeling module, so that function is
  wrapped (once per module, for every model of that family in the process); the wrapper
  picks by the tensors' device, so CPU tensors still compute transformers' formula.

Layers are replaced per instance, and only where a fast path would run on the model's device
(``registry.backends``); on a CPU nothing is replaced, and the report says so. A replaced
layer still asks the registry on every call, so ``TWINKLE_KERNELS=off`` later turns it back
to the reference. Applying it twice replaces nothing the second time.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from twinkle.kernel import registry
from twinkle.kernel.grouped_matmul import OP as GROUPED_MATMUL
from twinkle.kernel.grouped_matmul import grouped_matmul
from twinkle.kernel.rms_norm import OP as RMS_NORM
from twinkle.kernel.rms_norm import rms_norm
from twinkle.kernel.rotary_embedding import OP as ROTARY_EMBEDDING
from twinkle.kernel.rotary_embedding import rotary_embedding
from twinkle.kernel.swiglu import OP as SWIGLU
from twinkle.kernel.swiglu import swiglu

logger = logging.getLogger(__name__)

FAMILIES = ("Llama", "Qwen2", "Qwen2Moe", "Qwen3", "Qwen3Moe", "Mistral", "Mixtral")
"""Model families whose RMSNorm, rotary embedding and experts match the references."""
RMS_NORMS = frozenset(f"{family}RMSNorm" for family in FAMILIES)
ATTENTIONS = frozenset(f"{family}Attention" for family in FAMILIES)
EXPERTS = frozenset(f"{family}Experts" for family in FAMILIES)
SILU = ("SiLU", "SiLUActivation")
MARK = "_twinkle_kernel"


@dataclass(frozen=True)
class Replacement:
    """One layer (or modeling-module function) now routed through ``op``'s ``backend``."""

    module: str
    kind: str
    op: str
    backend: str


@dataclass
class KernelReport:
    """What ``kernelize`` replaced, and for each op it found layers of but left alone, why."""

    device_type: str
    replaced: list[Replacement] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[tuple[str, str], int]:
        """``(op, backend) -> number of layers`` replaced."""
        totals: dict[tuple[str, str], int] = {}
        for item in self.replaced:
            totals[item.op, item.backend] = totals.get((item.op, item.backend), 0) + 1
        return totals

    def __str__(self) -> str:
        if not self.replaced and not self.kept:
            return f"kernelize on {self.device_type}: the model has no layer it knows"
        lines = [f"kernelize on {self.device_type}:"]
        counts = self.counts().items()
        lines += [f"  {op} -> {backend}: {n} layer(s)" for (op, backend), n in counts]
        lines += [f"  {op}: kept the model's own ({why})" for op, why in self.kept.items()]
        if not self.replaced:
            lines.append("  nothing replaced")
        return "\n".join(lines)


def _is_silu(module: nn.Module) -> bool:
    return type(getattr(module, "act_fn", None)).__name__ in SILU


def _is_rms_norm(module: nn.Module) -> bool:
    return type(module).__name__ in RMS_NORMS and hasattr(module, "variance_epsilon")


def _is_swiglu_mlp(module: nn.Module) -> bool:
    projections = ("gate_proj", "up_proj", "down_proj")
    return all(isinstance(getattr(module, p, None), nn.Module) for p in projections) and (
        _is_silu(module)
    )


def _is_experts(module: nn.Module) -> bool:
    weights = [getattr(module, name, None) for name in ("gate_up_proj", "down_proj")]
    return (
        type(module).__name__ in EXPERTS
        and all(isinstance(w, torch.Tensor) and w.dim() == 3 for w in weights)
        and not hasattr(module, "gate_up_proj_bias")
        and _is_silu(module)
    )


def _rms_norm_forward(module: nn.Module) -> Callable:
    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, module.weight, module.variance_epsilon)

    return forward


def _mlp_forward(module: nn.Module) -> Callable:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return module.down_proj(swiglu(module.gate_proj(x), module.up_proj(x)))

    return forward


def _experts_forward(module: nn.Module) -> Callable:
    def forward(hidden_states, top_k_index, top_k_weights):
        experts = module.gate_up_proj.shape[0]
        flat = top_k_index.reshape(-1)
        # Expert parallel marks tokens routed to other ranks' experts with ``experts``: they
        # sort last and are dropped.
        counts = torch.bincount(flat, minlength=experts + 1)
        order = flat.argsort(stable=True)[: int(counts[:experts].sum())]
        tokens = order // top_k_index.shape[-1]
        sizes = counts[:experts]
        gate, up = grouped_matmul(
            hidden_states[tokens], module.gate_up_proj.transpose(1, 2), sizes
        ).chunk(2, dim=-1)
        out = grouped_matmul(swiglu(gate, up), module.down_proj.transpose(1, 2), sizes)
        out = out * top_k_weights.reshape(-1)[order, None]
        return torch.zeros_like(hidden_states).index_add_(0, tokens, out.to(hidden_states.dtype))

    return forward


def _rotary_function(original: Callable) -> Callable:
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        return rotary_embedding(q, k, cos, sin, unsqueeze_dim)

    apply_rotary_pos_emb.__wrapped__ = original
    setattr(apply_rotary_pos_emb, MARK, ROTARY_EMBEDDING)
    return apply_rotary_pos_emb


LAYERS: tuple[tuple[str, Callable[[nn.Module], bool], Callable[[nn.Module], Callable]], ...] = (
    (RMS_NORM, _is_rms_norm, _rms_norm_forward),
    (SWIGLU, _is_swiglu_mlp, _mlp_forward),
    (GROUPED_MATMUL, _is_experts, _experts_forward),
)
"""(op, which layers, their new forward) for the layers replaced per instance."""


def _device_of(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return torch.device("cpu") if parameter is None else parameter.device


def kernelize(model: nn.Module, device: registry.Device | None = None) -> KernelReport:
    """Route ``model``'s known layers through the fast paths that run on ``device`` (default:
    the device of its first parameter); returns (and logs) what it replaced."""
    kind = registry.device_type(device if device is not None else _device_of(model))
    report = KernelReport(kind)
    ops = (*(op for op, *_ in LAYERS), ROTARY_EMBEDDING)
    chosen = {op: registry.backends(op, kind)[0] for op in ops}
    for name, module in model.named_modules():
        for op, applies, new_forward in LAYERS:
            if getattr(module, MARK, None) is not None or not applies(module):
                continue
            if chosen[op] == registry.REFERENCE:
                report.kept[op] = f"no fast path for {op} runs on {kind}"
                continue
            module.forward = new_forward(module)
            setattr(module, MARK, op)
            report.replaced.append(Replacement(name, type(module).__name__, op, chosen[op]))
        if type(module).__name__ in ATTENTIONS:
            _kernelize_rotary(module, chosen[ROTARY_EMBEDDING], kind, report)
    logger.info("%s", report)
    return report


def _kernelize_rotary(attention: nn.Module, backend: str, kind: str, report: KernelReport):
    modeling = sys.modules[type(attention).__module__]
    original = getattr(modeling, "apply_rotary_pos_emb", None)
    if original is None or getattr(original, MARK, None) is not None:
        return
    if backend == registry.REFERENCE:
        report.kept[ROTARY_EMBEDDING] = f"no fast path for {ROTARY_EMBEDDING} runs on {kind}"
        return
    modeling.apply_rotary_pos_emb = _rotary_function(original)
    where = f"{modeling.__name__}.apply_rotary_pos_emb"
    report.replaced.append(Replacement(where, "function", ROTARY_EMBEDDING, backend))
