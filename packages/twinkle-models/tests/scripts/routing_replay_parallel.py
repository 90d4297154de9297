"""Routing replay through TransformersModel(routing_replay=True), on one process or under
torchrun (EP(2) with DDP, and EP(2) with Ulysses SP(2) on the same two ranks):

    torchrun --nproc_per_node=2 routing_replay_parallel.py OUT

``forward_only`` records the routes of a batch of uneven rows; the routers are then negated
(every token's top-2 of 4 experts becomes its bottom-2); ``forward_backward`` on the batch,
in micro-batches of one row, must route each real token to the recorded experts, and with
``routing_replay=False`` to others. What each router returned to its MoE block is read by a
tap module put between the block and its router, after the hooks, so the test sees what the
experts were given. Results go to OUT/rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from transformers import AutoConfig

from twinkle.mesh import DeviceMesh
from twinkle.model import TransformersModel
from twinkle.model.transformers.router_aux_loss import _router_class

CONFIG = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
CONFIG.update(head_dim=16, vocab_size=512, pad_token_id=0, num_experts_per_tok=2, num_experts=4)
CONFIG.update(moe_intermediate_size=32, intermediate_size=128)
LENGTHS = (9, 4, 12, 6)


class Tap(nn.Module):
    """Calls the router (its hooks included) and keeps the expert indices it returned."""

    def __init__(self, router: nn.Module, seen: list) -> None:
        super().__init__()
        self.router, self.seen = router, seen

    def forward(self, hidden: torch.Tensor):
        out = self.router(hidden)
        self.seen.append(out[2].detach().clone())
        return out


def tap_routers(model: TransformersModel) -> list[torch.Tensor]:
    """Put a Tap between every MoE block and its router; the list fills as they run."""
    hf = model._hf_model()
    router_class, _ = _router_class(hf)
    seen: list[torch.Tensor] = []
    for block in list(hf.modules()):
        for name, child in list(block.named_children()):
            if isinstance(child, router_class):
                setattr(block, name, Tap(child, seen))
    return seen


def real_token_routes(seen: list[torch.Tensor], masks: list[torch.Tensor], shards: bool) -> list:
    """Per layer, the experts of every token in row order, from the router calls of forwards
    over ``masks`` (one (rows, T) mask per forward). A whole forward routed each row's T
    positions or, packed, its real tokens alone: the real tokens are kept. Under Ulysses
    (``shards``) each rank routed its shard of every row, padding included: kept as it is."""
    layers = len(seen) // len(masks)
    out = [[] for _ in range(layers)]
    for call, routes in enumerate(seen):
        mask = masks[call // layers].bool().flatten()
        if not shards and routes.shape[0] == mask.numel():
            routes = routes[mask]
        out[call % layers].append(routes)
    return [torch.cat(layer).tolist() for layer in out]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def rows_of(generator: torch.Generator) -> list[dict]:
    rows = []
    for length in LENGTHS:
        ids = torch.randint(1, CONFIG["vocab_size"], (length,), generator=generator).tolist()
        rows.append({"input_ids": ids, "labels": ids})
    return rows


def replay_case(mesh: DeviceMesh | None) -> dict:
    model = TransformersModel(
        config=AutoConfig.for_model("qwen3_moe", **CONFIG),
        device="cpu",
        device_mesh=mesh,
        routing_replay=True,
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.model.named_parameters():
            if "gate.weight" in name:  # routers start at zero: spread them so experts differ
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    model.set_optimizer("AdamW", lr=1e-3)
    rows = rows_of(generator)
    rows = rows if mesh is None else rows[mesh.get_slice(len(rows))]
    sp_shards = mesh is not None and mesh.size("ulysses") > 1
    seen = tap_routers(model)
    model.forward_only(rows)
    collate = model._collate  # the model's own padded batch, for the masks of its forwards
    batch = collate(rows, model._state(None))
    whole = [batch["attention_mask"]]
    micro = [batch["attention_mask"][i : i + 1] for i in range(len(rows))]
    recorded = real_token_routes(seen, whole, sp_shards)
    seen.clear()
    routers = [m for m in model.model.modules() if isinstance(m, Tap)]
    with torch.no_grad():
        for tap in routers:
            tap.router.weight.mul_(-1.0)
    model.forward_backward(rows, micro_batch_size=1)
    replayed = real_token_routes(seen, micro, sp_shards)
    seen.clear()
    model.forward_backward(rows, micro_batch_size=1, routing_replay=False)
    free = real_token_routes(seen, micro, sp_shards)
    grads = [
        float(_local(t.router.weight.grad).abs().sum())
        for t in routers
        if t.router.weight.grad is not None
    ]
    return {
        "tokens": int(batch["attention_mask"].sum()),
        "sp_shards": sp_shards,
        "replay_equal": replayed == recorded,
        "free_equal": free == recorded,
        "router_grads": grads,
    }


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    result = {
        "ep_ddp": replay_case(DeviceMesh.from_sizes(dp_size=2, ep_size=2, device_type="cpu")),
        "ep_sp": replay_case(
            DeviceMesh.from_sizes(world_size=2, ep_size=2, ulysses_size=2, device_type="cpu")
        ),
    }
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()
    os._exit(0)  # see ep_equivalence.py: gloo's teardown can abort a rank after its peer left


if __name__ == "__main__":
    main(Path(sys.argv[1]))
