"""Issue 17's losses by name on the Twinkle routes: the allow-list offers them, each trains
on what the client sends, and a missing input or a bad hyperparameter is a 400 naming it."""

from __future__ import annotations

import pytest

FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}
OTHER = {"input_ids": [1, 2, 7, 8, 9], "labels": [-100, -100, 7, 8, 9]}
LOGPS = [-1.0, -1.25, -0.75, -1.5]


@pytest.fixture(scope="module")
def tenant(server, make_tenant):
    _, http, keys = server
    alice = make_tenant(http, keys["alice"])
    return alice, alice.new_run()


@pytest.mark.parametrize("loss", ["SAPOLoss", "BNPOLoss", "DRGRPOLoss", "PPOLoss"])
def test_the_grpo_family_and_ppo_train_by_name(tenant, loss):
    alice, run = tenant
    alice.ok(run, "set_loss", loss=loss)
    out = alice.ok(
        run, "forward_backward", inputs=[FEATURE] * 2, old_logps=[LOGPS] * 2, advantages=[1.0, -1.0]
    )
    assert out["loss"] is not None


def test_decoupled_ppo_trains_by_name_on_the_tenant_s_proximal_logps(tenant):
    alice, run = tenant
    alice.ok(run, "set_loss", loss="DecoupledPPOLoss", max_weight=2.0)
    stale = [v - 0.5 for v in LOGPS]  # the sampler's, one policy version behind
    out = alice.ok(
        run, "forward_backward", inputs=[FEATURE] * 2, old_logps=[stale] * 2,
        prox_logps=[LOGPS] * 2, advantages=[1.0, -1.0],
    )  # fmt: skip
    assert out["loss"] is not None


def test_reference_free_preference_losses_train_by_name(tenant):
    alice, run = tenant
    for loss in ("SimPOLoss", "CPOLoss", "ORPOLoss"):
        alice.ok(run, "set_loss", loss=loss)
        assert alice.ok(run, "forward_backward", inputs=[FEATURE, OTHER])["loss"] > 0


@pytest.mark.parametrize(
    ("set_loss", "batch", "message"),
    [
        ({"loss": "PPOLoss"}, {"advantages": [1.0, 1.0]}, "PPOLoss needs old_logps"),
        ({"loss": "SAPOLoss", "beta": 0.1}, {"advantages": [1.0, 1.0]}, "needs ref_logps"),
        ({"loss": "GKDLoss"}, {}, "GKDLoss needs teacher_logits"),
        (
            {"loss": "DecoupledPPOLoss"},
            {"advantages": [1.0, 1.0], "old_logps": [LOGPS] * 2},
            "DecoupledPPOLoss needs prox_logps",
        ),
        ({"loss": "DecoupledPPOLoss", "max_weight": 0.5}, None, "max_weight must be a finite"),
        ({"loss": "SAPOLoss", "tau_pos": -1}, None, "tau_pos must be a positive"),
        ({"loss": "DRGRPOLoss", "max_completion_length": 0}, None, "max_completion_length"),
        ({"loss": "PPOValueLoss"}, None, "PPOValueLoss"),  # needs a value model: not offered
    ],
)
def test_mistakes_are_400s_naming_the_argument(tenant, set_loss, batch, message):
    alice, run = tenant
    response = alice.call(run, "set_loss", **set_loss)
    if batch is not None:
        assert response.status_code == 200, response.text
        response = alice.call(run, "forward_backward", inputs=[FEATURE] * 2, **batch)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"], response.json()["error"]
