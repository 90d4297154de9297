"""Routing replay on the bundled Qwen3-MoE: replayed on unchanged weights the forward is the
plain one exactly; after the routers moved, the replayed forward routes to the recorded
experts (not its own), the routers still get gradients, and a mismatched batch is refused.

Through ``TransformersModel(routing_replay=True)`` (scripts/routing_replay_parallel.py): the
routes ``forward_only`` recorded for a batch of uneven rows (run packed) are the experts
every real token gets in ``forward_backward``'s one-row micro-batches after the routers were
negated, and not without replay; on one process here, and under torchrun on two ranks with
EP(2) over DDP and EP(2) with Ulysses SP(2) (each rank replays its own sequence shard).
"""

import importlib.util
import json
from pathlib import Path

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
    too_many = pytest.raises(ValueError, match="routes for a model with 2 routers")
    with too_many, torch.no_grad(), replay_routing(hf_model, routes + routes):
        hf_model(input_ids=IDS)


SCRIPT = Path(__file__).parent / "scripts" / "routing_replay_parallel.py"


def check_replay(result: dict) -> None:
    assert result["tokens"] > 0
    assert result["replay_equal"], "the training forward routed other experts than recorded"
    assert not result["free_equal"], "negated routers chose the recorded experts anyway"
    assert len(result["router_grads"]) == 2 and min(result["router_grads"]) > 0


def test_model_flag_replays_the_recorded_experts_in_micro_batches():
    spec = importlib.util.spec_from_file_location("routing_replay_parallel", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    check_replay(script.replay_case(None))


def test_a_batch_without_recorded_routes_is_refused(hf_model):
    model = TransformersModel("bundled://tiny-qwen3-moe", routing_replay=True)
    rows = [{"input_ids": [5, 6, 7, 8], "labels": [5, 6, 7, 8]}]
    with pytest.raises(ValueError, match=r"no routes were recorded.*forward_only\(batch\)"):
        model.forward_backward(rows)
    model.forward_only(rows)
    model.forward_backward(rows)  # recorded now
    other = [{"input_ids": [5, 6, 7, 9], "labels": [5, 6, 7, 9]}]
    with pytest.raises(ValueError, match="no routes were recorded"):
        model.forward_backward(other)
    model.forward_backward(other, routing_replay=False)
    with pytest.raises(TypeError, match="routing_replay must be True, False or None"):
        model.forward_backward(rows, routing_replay="yes")
    with pytest.raises(TypeError, match="routing_replay must be True or False"):
        TransformersModel("bundled://tiny-qwen3-moe", routing_replay=1)


def test_policy_logps_record_the_routes_for_decoupled_ppo(hf_model):
    """DecoupledPPOLoss's proximal pass is policy_logps, not forward_only: it records too."""
    model = TransformersModel("bundled://tiny-qwen3-moe", routing_replay=True)
    model.set_loss("DecoupledPPOLoss")
    rows = [{"input_ids": [5, 6, 7, 8], "labels": [-100, 6, 7, 8]}]
    prox = model.policy_logps(rows)
    model.forward_backward(rows, advantages=[1.0], old_logps=prox, prox_logps=prox)
    other = [{"input_ids": [5, 6, 7, 9], "labels": [-100, 6, 7, 9]}]
    model.policy_logps(other, routing_replay=False)
    with pytest.raises(ValueError, match="no routes were recorded"):
        model.forward_backward(other, advantages=[1.0], old_logps=prox, prox_logps=prox)


def test_replay_under_expert_and_sequence_parallel(torchrun, tmp_path):
    torchrun(SCRIPT, tmp_path, procs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in ranks:
        check_replay(rank["ep_ddp"])
        check_replay(rank["ep_sp"])
        assert rank["ep_sp"]["sp_shards"]
    # EP over DDP: each rank trains its own rows; under SP both ranks hold the whole batch.
    assert ranks[0]["ep_ddp"]["tokens"] + ranks[1]["ep_ddp"]["tokens"] == 31
    assert ranks[0]["ep_sp"]["tokens"] == ranks[1]["ep_sp"]["tokens"] == 31
