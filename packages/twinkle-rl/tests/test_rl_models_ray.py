"""RL's extra models as remote components on Ray groups of their own (a local CPU cluster):
a PPO critic (``TransformersValueModel``) on a 'value' group, a distillation teacher's
logprobs and full logits (``forward_only``, ``token_logits``) on a 'teacher' group, each
equal to the same model built in the driver; and a MoE policy on a 'policy' group of two
data-parallel workers with ``routing_replay=True``, where the flag and the per-call override
reach the workers: each worker records the routes of its share of the rows in
``forward_only`` and replays them in ``forward_backward`` after AdamW moved the routers, so
the losses equal a one-process model replaying the same way and differ from one that does
not.

Tolerance: 1e-5 absolute (float32; the two-worker runs differ from one process only in
how the gradient sum is formed, as in twinkle-models' test_ray_sft).
"""

import pytest
import torch

import twinkle
from twinkle import DeviceGroup, DeviceMesh
from twinkle.infra import RemoteError, reset
from twinkle.infra.ray import runtime as ray_runtime
from twinkle.model import TransformersModel, TransformersValueModel

DENSE, MOE = "bundled://tiny-qwen3", "bundled://tiny-qwen3-moe"
TOLERANCE = 1e-5


def rows(lengths=(9, 4, 12, 6), seed=0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for length in lengths:
        ids = torch.randint(1, 900, (length,), generator=generator).tolist()
        out.append({"input_ids": ids, "labels": [-100, -100, *ids[2:]]})
    return out


@pytest.fixture(scope="module")
def groups(ray_cluster):
    twinkle.initialize(
        "ray",
        groups=[
            DeviceGroup(name="policy", ranks=2, device_type="cpu"),
            DeviceGroup(name="value", ranks=1, device_type="cpu"),
            DeviceGroup(name="teacher", ranks=1, device_type="cpu"),
        ],
        lazy_collect=False,
    )
    yield
    ray_runtime.shutdown()
    reset()


def test_a_value_model_on_its_own_group_trains_as_in_the_driver(groups):
    batch = rows()
    returns = torch.randn((4, 12), generator=torch.Generator().manual_seed(1))
    losses = {}
    for where in ("remote", "local"):
        group = {"remote_group": "value"} if where == "remote" else {}
        critic = TransformersValueModel(DENSE, seed=0, **group)
        critic.set_optimizer("AdamW", lr=1e-2)
        old = critic.forward_only(batch)["values"]
        assert old.shape == (4, 12)
        losses[where] = []
        for _ in range(3):  # clipped: each step moves the values at most 0.2 from old_values
            out = critic.forward_backward(batch, returns=returns, old_values=old)
            critic.clip_grad_and_step()
            losses[where].append(out.loss)
        losses[where].append(critic.forward_only(batch)["values"])
    remote, local = losses["remote"], losses["local"]
    assert remote[:3] == pytest.approx(local[:3], abs=TOLERANCE)
    assert len(set(remote[:3])) == 3  # the critic trained
    torch.testing.assert_close(remote[3], local[3], rtol=0, atol=TOLERANCE)


def test_a_teacher_on_its_own_group_scores_as_in_the_driver(groups):
    batch = rows()
    teacher = TransformersModel(MOE, seed=0, remote_group="teacher")
    local = TransformersModel(MOE, seed=0)
    logps, expected = teacher.forward_only(batch).logps, local.forward_only(batch).logps
    assert logps.shape == (4, 12) and logps.abs().sum() > 0
    torch.testing.assert_close(logps, expected, rtol=0, atol=TOLERANCE)
    logits = teacher.token_logits(batch)
    torch.testing.assert_close(logits, local.token_logits(batch), rtol=0, atol=TOLERANCE)
    assert logits.shape[:2] == (4, 12)


def replay_losses(model, batch) -> list[float]:
    """Record the routes, take a large AdamW step (the routers move), train the batch again:
    with replay the second forward routes to the recorded experts."""
    model.set_optimizer("AdamW", lr=0.2)
    model.forward_only(batch)
    first = model.forward_backward(batch).loss
    model.clip_grad_and_step(1e9)
    return [first, model.forward_backward(batch).loss]


def test_routing_replay_reaches_the_policy_workers(groups):
    batch = rows()
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    policy = TransformersModel(
        MOE, seed=0, remote_group="policy", device_mesh=mesh, routing_replay=True
    )
    remote = replay_losses(policy, batch)
    with pytest.raises(RemoteError, match="no routes were recorded"):
        policy.forward_backward(rows(seed=5))
    policy.forward_backward(rows(seed=5), routing_replay=False)  # the override travels too
    replayed = replay_losses(TransformersModel(MOE, seed=0, routing_replay=True), batch)
    free = replay_losses(TransformersModel(MOE, seed=0), batch)
    assert remote[0] == pytest.approx(replayed[0], abs=TOLERANCE)
    # After the lr-0.2 AdamW step: 1.5e-5 apart on some machines of this kind (5.14 loss),
    # float noise the step magnified; unreplayed routes move it by over 1e-3.
    assert remote[1] == pytest.approx(replayed[1], abs=5 * TOLERANCE)
    assert abs(free[1] - replayed[1]) > 100 * TOLERANCE, (free, replayed)
