"""Routing replay for MoE RL: the experts chosen when the old logps were computed, chosen
again in the training forward, so the policy ratio compares the same experts (a router
that flips an expert between the two passes otherwise puts routing noise into the ratio).

Two levels. ``with record_routing(hf_model) as routes:`` around a forward collects each
router's expert indices (one entry per router module, in module order); ``with
replay_routing(hf_model, routes):`` around a later forward makes each router return those
indices, with routing weights recomputed from the current logits at them (softmax,
renormalised when the family normalises its top-k), so the router still gets gradients.
A router is matched by module, not by call order, so gradient checkpointing's recompute
in the backward replays the same experts. ``RoutingReplay`` is what
``TransformersModel(routing_replay=True)`` keeps: routes per batch (keyed by its tokens and
the trained unit), recorded by ``forward_only`` and replayed by ``forward_backward`` on the
same batch or any of its micro-batches.

Routes are stored per token of the forward's own layout: each row's tokens (B, T, top_k)
when the batch runs whole, padded or packed (a packed row is the real tokens in row order),
and this rank's sequence shard (B, T / sp, top_k) under Ulysses SP, so each rank replays
the tokens it routed; under expert parallel each rank routes its own tokens before the
all-to-all, which is where the routes are taken. Covers routers returning ``(logits,
weights, indices)`` from softmax top-k (Qwen3-MoE, Qwen3.5-MoE); a router that routes
otherwise (sigmoid with bias, group-limited) is refused.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from twinkle.model.transformers.router_aux_loss import _router_class

Routes = list[torch.Tensor | None]
"""Per router module (in ``model.modules()`` order), the (tokens, top_k) expert indices."""


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
def record_routing(model: nn.Module) -> Iterator[Routes]:
    """Each router's expert indices (tokens, top_k) from the forward run while open."""
    routers = _routers(model)
    routes: Routes = [None] * len(routers)

    def hook_of(index: int):
        def hook(module, args, output):
            routes[index] = output[2].detach().clone()

        return hook

    handles = [router.register_forward_hook(hook_of(i)) for i, router in enumerate(routers)]
    try:
        yield routes
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def replay_routing(model: nn.Module, routes: Routes) -> Iterator[None]:
    """Every router call while open routes to its recorded experts."""
    with _replaying(model, len(routes), lambda index, tokens: routes[index]):
        yield


@contextmanager
def _replaying(
    model: nn.Module, count: int, lookup: Callable[[int, int], torch.Tensor | None]
) -> Iterator[None]:
    """Router ``i`` routes a forward of ``n`` tokens to ``lookup(i, n)``'s experts."""
    routers = _routers(model)
    if count != len(routers):
        raise ValueError(
            f"routing replay: {count} routes for a model with {len(routers)} routers; "
            f"replay on the model the routes were recorded on"
        )
    used = [False] * len(routers)

    def hook_of(index: int):
        def hook(module, args, output):
            logits = output[0]
            if logits is None:
                raise ValueError(
                    "routing replay recomputes the routing weights from the router logits, "
                    "which this router does not return: set ExpertParallelConfig("
                    "keep_router_logits=True)"
                )
            indices = lookup(index, output[2].shape[0])
            if indices is None or indices.shape != output[2].shape:
                raise ValueError(
                    "routing replay: this forward routes other tokens than the recorded one; "
                    "replay on the batch the routes were recorded on"
                )
            used[index] = True
            indices = indices.to(logits.device)
            weights = logits.float().softmax(dim=-1).gather(-1, indices)
            if module.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(output[1].dtype), indices

        return hook

    handles = [router.register_forward_hook(hook_of(i)) for i, router in enumerate(routers)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
    if not all(used):
        raise ValueError("routing replay: the forward ran fewer routers than were recorded")


def _batch_key(batch: dict, unit: str) -> str:
    """The batch's identity: its tokens, padding and the unit (adapter) that runs it."""
    digest = hashlib.blake2b(unit.encode(), digest_size=16)
    for name in ("input_ids", "attention_mask", "position_ids"):
        value = batch.get(name)
        if torch.is_tensor(value):
            digest.update(f"{name}{tuple(value.shape)}".encode())
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class RoutingReplay:
    """A model's routes per batch: ``record`` in the old-logps forward, ``replay`` in the
    training forwards of that batch (``capacity`` batches kept, the oldest dropped first).

    ``splits_sequences``: the forward runs a shard of each row (Ulysses SP), so the routes
    are this rank's shard's, (B, T_shard, top_k). ``engaged`` tells the forward inside a
    record or replay, which then keeps the layout the routes are stored in.
    """

    def __init__(self, enabled: bool = False, capacity: int = 16) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"routing_replay must be True or False, got {enabled!r}")
        self.enabled, self.capacity = enabled, capacity
        self._routes: OrderedDict[str, Routes] = OrderedDict()
        self._engaged = 0

    @property
    def engaged(self) -> bool:
        """Whether a forward runs inside ``record`` or ``replay`` now: under SP its routes are
        per shard of the padded rows, so such a forward must not pack them."""
        return self._engaged > 0

    @contextmanager
    def _engaging(self, context: Any) -> Iterator[Any]:
        self._engaged += 1
        try:
            with context as value:
                yield value
        finally:
            self._engaged -= 1

    def active(self, override: bool | None) -> bool:
        """The call's ``routing_replay`` when given, else the model's."""
        if override is not None and not isinstance(override, bool):
            raise TypeError(f"routing_replay must be True, False or None, got {override!r}")
        return self.enabled if override is None else override

    def record(
        self, model: nn.Module, batch: dict, unit: str, splits_sequences: bool, on: bool
    ) -> Any:
        """A context recording the routes of ``batch``'s forward (nothing when off)."""
        return self._recording(model, batch, unit, splits_sequences) if on else nullcontext()

    @contextmanager
    def _recording(self, model, batch, unit, splits_sequences) -> Iterator[None]:
        with self._engaging(record_routing(model)) as flat:
            yield
        rows = batch["input_ids"].shape[0]
        mask = None if splits_sequences else batch.get("attention_mask")
        grids = [None if f is None else _to_grid(f, rows, mask) for f in flat]
        key = _batch_key(batch, unit)
        self._routes.pop(key, None)
        self._routes[key] = grids
        while len(self._routes) > self.capacity:
            self._routes.popitem(last=False)

    def replay(
        self,
        model: nn.Module,
        batch: dict,
        unit: str,
        rows: slice,
        micro: dict,
        splits_sequences: bool,
        on: bool,
    ) -> Any:
        """A context replaying, in ``micro`` (rows ``rows`` of ``batch``), the routes
        recorded for ``batch``; an error when none were (nothing when off)."""
        if not on:
            return nullcontext()
        grids = self._routes.get(_batch_key(batch, unit))
        if grids is None:
            raise ValueError(
                "routing_replay is on but no routes were recorded for this batch: compute its "
                "old logps with forward_only(batch) first (that forward records them), or pass "
                "routing_replay=False to route this forward freely"
            )
        mask = None if splits_sequences else micro.get("attention_mask")
        grids = [None if g is None else g[rows] for g in grids]
        replaying = _replaying(
            model, len(grids), lambda i, tokens: _in_layout(grids[i], mask, tokens)
        )
        return self._engaging(replaying)


def _to_grid(flat: torch.Tensor, rows: int, mask: torch.Tensor | None) -> torch.Tensor:
    """(tokens, k) router indices as (rows, columns, k): a packed forward's real tokens are
    scattered to their places (padding gets experts 0..k-1, which no loss reads)."""
    tokens, k = flat.shape
    if mask is not None and tokens == int(mask.sum()) and tokens != mask.numel():
        grid = torch.arange(k, dtype=flat.dtype).expand(*mask.shape, k).clone()
        grid[mask.bool().cpu()] = flat.cpu()
        return grid
    if tokens % rows:
        raise ValueError(
            f"routing replay: {tokens} routed tokens do not fill the batch's {rows} rows"
        )
    return flat.cpu().view(rows, tokens // rows, k)


def _in_layout(
    grid: torch.Tensor | None, mask: torch.Tensor | None, tokens: int
) -> torch.Tensor | None:
    """``grid``'s (tokens, k) indices as a forward of ``tokens`` tokens routes them: every
    position, or the real tokens alone of a forward that packs its rows."""
    if grid is None:
        return None
    if tokens == grid.shape[0] * grid.shape[1]:
        return grid.reshape(-1, grid.shape[-1])
    if mask is not None and mask.shape == grid.shape[:2] and tokens == int(mask.sum()):
        return grid[mask.bool().cpu()]
    return None
