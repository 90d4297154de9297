"""Routing replay for MoE RL: the experts chosen when the old logps were computed, chosen
again in the training forward, so the policy ratio compares the same experts (a router
that flips an expert between the two passes otherwise puts routing noise into the ratio).

``with record_routing(hf_model) as routes:`` around the old-logps forward collects each
router call's expert indices in layer order; ``with replay_routing(hf_model, routes):``
around the training forward makes each router call return those indices, with routing
weights recomputed from the current logits at them (softmax, renormalised when the family
normalises its top-k), so the router still gets gradients. Covers routers returning
``(logits, weights, indices)`` from softmax top-k (Qwen3-MoE, Qwen3.5-MoE); a router that
routes otherwise (sigmoid with bias, group-limited) is refused. ``hf_model`` is the Hugging
Face model (``model._hf_model()``), the batch must be the same in both passes, and the
forward must run unsplit (no expert or sequence parallel).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from twinkle.model.transformers.router_aux_loss import _router_class


def _routers(model: nn.Module) -> list[nn.Module]:
    router_class, _ = _router_class(model)
    routers = [m for m in model.modules() if isinstance(m, router_class)]
    if not routers or not all(
        hasattr(r, "top_k") and hasattr(r, "norm_topk_prob") for r in routers
    ):
        raise NotImplementedError(
            f"routing replay covers softmax top-k routers returning (logits, weights, indices); "
            f"{type(model).__name__}'s router is not one"
        )
    return routers


@contextmanager
def record_routing(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """The expert indices (tokens, top_k) of every router call while the context is open."""
    routes: list[torch.Tensor] = []

    def hook(module, args, output):
        routes.append(output[2].detach().clone())

    handles = [router.register_forward_hook(hook) for router in _routers(model)]
    try:
        yield routes
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def replay_routing(model: nn.Module, routes: list[torch.Tensor]) -> Iterator[None]:
    """Each router call, in order, routes to the recorded experts."""
    pending = iter(routes)

    def hook(module, args, output):
        logits = output[0]
        indices = next(pending, None)
        if indices is None or indices.shape != output[2].shape:
            raise ValueError(
                "routing replay: this forward calls the routers more often, or on other "
                "tokens, than the recorded one; replay on the batch the routes were recorded on"
            )
        indices = indices.to(logits.device)
        weights = logits.float().softmax(dim=-1).gather(-1, indices)
        if module.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return logits, weights.to(output[1].dtype), indices

    handles = [router.register_forward_hook(hook) for router in _routers(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
    if next(pending, None) is not None:
        raise ValueError("routing replay: the forward used fewer router calls than recorded")
