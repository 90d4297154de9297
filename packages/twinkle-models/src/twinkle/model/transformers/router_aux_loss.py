"""The MoE router load-balancing loss, computed by the model family's own transformers
function from router logits recorded during the forward.

The model runs with ``output_router_logits=False`` and forward hooks on its router modules
record the logits instead: transformers would otherwise compute the loss inside the forward
with whatever attention mask it was given, and under Ulysses sequence parallel that is a
shard's worth of router logits and a full 4-D mask. Here the caller decides which logits
(gathered across the SP group, padding of the split dropped) and which mask (the batch's
2-D padding mask; packed rows have none) the loss sees.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def wants_router_aux_loss(model: nn.Module) -> bool:
    """True when the Hugging Face config asks for the load-balancing loss in training."""
    return bool(getattr(model.config.get_text_config(), "output_router_logits", False))


def _router_class(model: nn.Module) -> tuple[type[nn.Module], int]:
    recorder = getattr(model, "_can_record_outputs", {}).get("router_logits")
    if recorder is None or isinstance(recorder, str):
        raise NotImplementedError(
            f"{type(model).__name__} has output_router_logits=True but does not declare which "
            f"module produces router logits; set config.output_router_logits=False"
        )
    return recorder.target_class, recorder.index


@contextmanager
def record_router_logits(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collect each router's logits ((tokens, num_experts), in layer order) while the block
    runs. ``model`` is the Hugging Face model (not a peft or strategy wrapper)."""
    router_class, index = _router_class(model)
    recorded: list[torch.Tensor] = []

    def hook(module, args, output):
        logits = output[index] if isinstance(output, tuple | list) else output
        if logits is not None:
            recorded.append(logits)

    handles = [
        module.register_forward_hook(hook)
        for module in model.modules()
        if isinstance(module, router_class)
    ]
    try:
        yield recorded
    finally:
        for handle in handles:
            handle.remove()


def router_aux_loss(
    model: nn.Module, router_logits: list[torch.Tensor], attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """transformers' ``load_balancing_loss_func`` of ``model``'s family on full-sequence
    router logits; ``attention_mask`` (B, T) keeps padding out of the expert statistics."""
    if not router_logits:
        raise ValueError(
            "output_router_logits=True but no router returned logits; with expert "
            "parallel, set ExpertParallelConfig(keep_router_logits=True)"
        )
    function = getattr(sys.modules[type(model).__module__], "load_balancing_loss_func", None)
    if function is None:
        raise NotImplementedError(
            f"{type(model).__module__} has no load_balancing_loss_func; set "
            f"config.output_router_logits=False to train {type(model).__name__} without it"
        )
    config = model.config.get_text_config()
    return function(
        tuple(router_logits), config.num_experts, config.num_experts_per_tok, attention_mask
    )
