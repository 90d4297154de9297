"""Routing replay on the bundled Qwen3-MoE: replayed on unchanged weights the forward is the
plain one exactly; after the routers moved, the replayed forward routes to the recorded
experts (not its own), the routers still get gradients, and a mismatched batch is refused."""

import pytest
import torch

from twinkle.model import TransformersModel
from twinkle.model.transformers.moe.routing_replay import record_routing, replay_routing


@pytest.fixture(scope="module")
def hf_model():
    return TransformersModel("bundled://tiny-qwen3-moe")._hf_model()


IDS = torch.randint(1, 1000, (2, 12), generator=torch.Generator().manual_seed(0))


def test_replay_on_the_same_weights_is_the_plain_forward(hf_model):
    with torch.no_grad(), record_routing(hf_model) as routes:
        plain = hf_model(input_ids=IDS).logits
    assert len(routes) == hf_model.config.num_hidden_layers
    with torch.no_grad(), replay_routing(hf_model, routes):
        replayed = hf_model(input_ids=IDS).logits
    torch.testing.assert_close(replayed, plain, rtol=0, atol=0)


def test_moved_routers_replay_the_recorded_experts(hf_model):
    with torch.no_grad(), record_routing(hf_model) as old_routes:
        hf_model(input_ids=IDS)
    routers = [m for m in hf_model.modules() if hasattr(m, "norm_topk_prob")]
    saved = [r.weight.detach().clone() for r in routers]
    try:
        with torch.no_grad():
            for router in routers:
                router.weight.add_(torch.randn_like(router.weight))
            with record_routing(hf_model) as own_routes:
                hf_model(input_ids=IDS)
        assert any(not torch.equal(a, b) for a, b in zip(old_routes, own_routes, strict=True))
        with replay_routing(hf_model, old_routes), record_routing(hf_model) as seen:
            hf_model(input_ids=IDS).logits.sum().backward()
        for old, used in zip(old_routes, seen, strict=True):
            assert torch.equal(old, used)
        assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers)
    finally:
        with torch.no_grad():
            for router, weight in zip(routers, saved, strict=True):
                router.weight.copy_(weight)
                router.weight.grad = None


def test_a_different_batch_is_refused(hf_model):
    with torch.no_grad(), record_routing(hf_model) as routes:
        hf_model(input_ids=IDS)
    other_batch = pytest.raises(ValueError, match="replay on the batch the routes were recorded")
    with other_batch, torch.no_grad(), replay_routing(hf_model, routes):
        hf_model(input_ids=IDS[:, :5])
    too_many = pytest.raises(ValueError, match="fewer router calls than recorded")
    with too_many, torch.no_grad(), replay_routing(hf_model, routes + routes):
        hf_model(input_ids=IDS)
