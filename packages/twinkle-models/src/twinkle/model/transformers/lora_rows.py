"""Per-row LoRA: one forward whose rows each run through their own tenant's adapter.

peft's ``adapter_names=`` mixes adapters row by row for inference, and refuses a model in
training mode (peft 0.21); this is the training counterpart, written for what peft lacks.
The tokens of one tenant are contiguous (a *segment*, as the segmented matmuls of multi-LoRA
servers group them: a block of padded rows, or a stretch of one packed row), so each LoRA
layer runs the shared base matmul once over the whole batch and then, per segment, that
tenant's ``B @ A @ dropout(x)`` on a view of its tokens, added into them. Ranks, scalings
and targets may differ between tenants: a segment whose adapter has no factors on a layer
adds nothing there. Gradients reach only the factors of the adapter a token ran through;
the shared base stays frozen.

A segment covers the tenant's tokens as its forward alone lays them out (its rows up to its
own padded width, or its own packed row), so its LoRA inputs, and the dropout masks drawn
for them from the tenant's own generators (``RandomStream``), have the shapes and values of
the tenant's forward run alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from peft.tuners.lora import Linear as LoraLinear
from peft.tuners.lora import LoraLayer


@dataclass(frozen=True)
class Segment:
    """``size`` consecutive rows (or, packed, columns of the one row) of a batch that belong
    to ``adapter``; of rows, only the first ``width`` positions are its (None: all)."""

    adapter: str
    size: int
    width: int | None = None
    stream: Any = None  # the adapter's RandomStream (its dropout masks), or None


def unsupported(model: torch.nn.Module, adapter: str) -> str | None:
    """Why ``adapter`` cannot run row by row in ``model`` (None when it can): only plain LoRA
    on linear layers is routed here (no DoRA or other variants, no LoRA bias, no merges)."""
    for name, layer in model.named_modules():
        if not isinstance(layer, LoraLayer) or adapter not in layer.lora_A:
            if isinstance(layer, LoraLayer) and adapter in getattr(layer, "lora_embedding_A", {}):
                return f"{name} is a LoRA embedding"
            continue
        if type(layer) is not LoraLinear:
            return f"{name} is a {type(layer).__name__}, not a LoRA Linear"
        if layer.merged:
            return f"{name} has merged adapters"
        if adapter in layer.lora_variant or layer.use_dora.get(adapter, False):
            return f"{name} uses a LoRA variant (DoRA or another)"
        if layer.lora_bias.get(adapter, False):
            return f"{name} trains a LoRA bias"
    return None


class RowRouter:
    """While ``routing()`` is open, every LoRA Linear of the model computes ``segments``,
    which tile the batch along ``axis`` (0: blocks of rows, 1: stretches of a packed row)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.layers = [m for m in model.modules() if isinstance(m, LoraLinear)]
        self.segments: Sequence[Segment] = ()
        self.axis = 0

    def split(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Each segment's part of a (B, T, ...) tensor (one split: its backward is one cat)."""
        parts = values.split([s.size for s in self.segments], dim=self.axis)
        return [
            part if segment.width is None else part[:, : segment.width]
            for segment, part in zip(self.segments, parts, strict=True)
        ]

    def join(self, parts: list[torch.Tensor], width: int) -> torch.Tensor:
        """The segments' parts as one tensor, rows right-padded with zeros to ``width``."""
        if self.axis == 0:
            parts = [F.pad(p, (0, 0, 0, width - p.shape[1])) for p in parts]
        return torch.cat(parts, dim=self.axis)

    @contextlib.contextmanager
    def routing(self, adapters: Sequence[str]) -> Iterator[RowRouter]:
        """Route the layers and let ``adapters``' factors receive gradients; both undone on
        exit (peft keeps only its active adapter trainable)."""
        touched: list[tuple[torch.nn.Parameter, bool]] = []
        for layer in self.layers:
            layer.forward = _routed_forward(layer, self)
            for adapter in (a for a in adapters if a in layer.lora_A):
                factors = (layer.lora_A[adapter], layer.lora_B[adapter])
                for param in (p for factor in factors for p in factor.parameters()):
                    touched.append((param, param.requires_grad))
                    param.requires_grad_(True)
        try:
            yield self
        finally:
            for layer in self.layers:
                del layer.forward  # back to the class's forward
            for param, flag in touched:
                param.requires_grad_(flag)


def _routed_forward(layer: LoraLinear, router: RowRouter):
    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        result = layer.base_layer(x, *args, **kwargs)
        if not any(segment.adapter in layer.lora_A for segment in router.segments):
            return result
        deltas = []
        for segment, part in zip(router.segments, router.split(x), strict=True):
            if segment.adapter not in layer.lora_A:
                deltas.append(part.new_zeros((*part.shape[:-1], result.shape[-1])))
                continue
            lora_a, lora_b = layer.lora_A[segment.adapter], layer.lora_B[segment.adapter]
            part = layer._cast_input_dtype(part, lora_a.weight.dtype)
            dropout = layer.lora_dropout[segment.adapter]
            draws = layer.training and isinstance(dropout, torch.nn.Dropout) and dropout.p > 0
            stream = segment.stream.drawing() if draws and segment.stream else None
            with stream or contextlib.nullcontext():
                dropped = dropout(part)
            deltas.append(lora_b(lora_a(dropped)) * layer.scaling[segment.adapter])
        return (result + router.join(deltas, x.shape[1])).to(result.dtype)

    return forward
