"""PPOValueLoss, SimPO, CPO and ORPO (and DPO's new statistics) against float64 loops
written pair by pair / token by token from the papers' formulas."""

import math

import pytest
import torch

from twinkle.loss import CPOLoss, DPOLoss, ORPOLoss, PPOValueLoss, SimPOLoss


def value_batch():
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 9, (2, 6), generator=gen)
    labels[:, :2] = -100
    labels[1, 4:] = -100
    values = torch.randn(2, 6, generator=gen, dtype=torch.float64)
    old = values + 0.4 * torch.randn(2, 6, generator=gen, dtype=torch.float64)
    returns = torch.randn(2, 6, generator=gen, dtype=torch.float64)
    return labels, values, old, returns


def test_value_loss_matches_the_clipped_loop():
    labels, values, old, returns = value_batch()
    eps = 0.2
    leaf = values.clone().requires_grad_()
    out = PPOValueLoss(epsilon=eps)(
        {"labels": labels}, {"values": leaf}, returns=returns, old_values=old
    )
    out["loss"].backward()
    ref_leaf = values.clone().requires_grad_()
    total, n, clipped = 0.0, 0, 0
    for b in range(2):
        for t in range(1, 6):
            if labels[b, t] == -100:
                continue
            v, o, r = ref_leaf[b, t], old[b, t], returns[b, t]
            v_clip = o + torch.clamp(v - o, -eps, eps)
            plain, far = (v - r) ** 2, (v_clip - r) ** 2
            clipped += int(far > plain)
            total = total + 0.5 * torch.maximum(plain, far)
            n += 1
    total.backward()
    assert out["num_tokens"].item() == n == 6
    assert out["loss"].item() == pytest.approx(total.item(), rel=1e-12)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=1e-12, atol=1e-12)
    assert out["value_stats"]["clipped"].item() == clipped > 0


def test_value_loss_bad_inputs_say_what_to_pass():
    labels, values, old, returns = value_batch()
    with pytest.raises(ValueError, match=r"needs outputs\['values'\].*TransformersValueModel"):
        PPOValueLoss()({"labels": labels}, {"logps": values}, returns=returns, old_values=old)
    with pytest.raises(ValueError, match="needs returns: pass returns"):
        PPOValueLoss()({"labels": labels}, {"values": values}, old_values=old)
    with pytest.raises(ValueError, match="needs old_values: value clipping"):
        PPOValueLoss()({"labels": labels}, {"values": values}, returns=returns)
    unclipped = PPOValueLoss(epsilon=None)({"labels": labels}, {"values": values}, returns=returns)
    mask = labels != -100
    mask[:, 0] = False
    expected = 0.5 * ((values - returns)[mask] ** 2).sum()
    assert unclipped["loss"].item() == pytest.approx(expected.item(), rel=1e-12)
    with pytest.raises(ValueError, match="epsilon"):
        PPOValueLoss(epsilon=-1)


def pair_batch():
    gen = torch.Generator().manual_seed(1)
    labels = torch.randint(0, 9, (4, 7), generator=gen)
    labels[:, :2] = -100
    labels[1, 5:] = -100  # the rejected response of pair 0 is shorter
    labels[2, 4:] = -100
    logps = -torch.rand(4, 7, generator=gen, dtype=torch.float64) * 2 - 0.05
    return labels, logps


def rows(labels, logps):
    """(sum, count) of each row's label-token logps, by a loop."""
    out = []
    for b in range(labels.shape[0]):
        picked = [logps[b, t] for t in range(1, labels.shape[1]) if labels[b, t] != -100]
        out.append((sum(picked), len(picked)))
    return out


def logsig(x):
    return -torch.log1p(torch.exp(-x))


def simpo(lp, labels, beta, gamma):
    r = rows(labels, lp)
    return sum(
        -logsig(beta * r[i][0] / r[i][1] - beta * r[i + 1][0] / r[i + 1][1] - gamma) for i in (0, 2)
    )


def cpo(lp, labels, beta, alpha):
    r = rows(labels, lp)
    return sum(-logsig(beta * (r[i][0] - r[i + 1][0])) - alpha * r[i][0] / r[i][1] for i in (0, 2))


def orpo(lp, labels, beta):
    r = rows(labels, lp)
    total = 0.0
    for i in (0, 2):
        pc, pr = torch.exp(r[i][0] / r[i][1]), torch.exp(r[i + 1][0] / r[i + 1][1])
        odds = torch.log(pc / (1 - pc)) - torch.log(pr / (1 - pr))
        total = total - torch.log(pc) - beta * logsig(odds)
    return total


@pytest.mark.parametrize(
    ("loss", "reference"),
    [
        (SimPOLoss(beta=2.0, gamma=0.5), lambda lp, lb: simpo(lp, lb, 2.0, 0.5)),
        (CPOLoss(beta=0.3, alpha=0.7), lambda lp, lb: cpo(lp, lb, 0.3, 0.7)),
        (ORPOLoss(beta=0.2), lambda lp, lb: orpo(lp, lb, 0.2)),
    ],
)
def test_reference_free_preference_losses_match_the_loops(loss, reference):
    labels, logps = pair_batch()
    leaf = logps.clone().requires_grad_()
    out = loss({"labels": labels}, {"logps": leaf})
    out["loss"].backward()
    ref_leaf = logps.clone().requires_grad_()
    expected = reference(ref_leaf, labels)
    expected.backward()
    assert out["num_tokens"].item() == 2
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-12)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=1e-12, atol=1e-12)
    stats = out["preference_stats"]
    assert stats["pairs"].item() == 2
    margin = stats["chosen_reward_sum"] - stats["rejected_reward_sum"]
    assert stats["margin_sum"].item() == pytest.approx(margin.item(), rel=1e-12)


def test_dpo_reports_its_implicit_rewards():
    labels, logps = pair_batch()
    ref = logps + 0.1
    out = DPOLoss(beta=0.5)({"labels": labels}, {"logps": logps}, ref_logps=ref)
    r_pi, r_ref = rows(labels, logps), rows(labels, ref)
    rewards = [0.5 * (r_pi[i][0] - r_ref[i][0]).item() for i in range(4)]
    stats = out["preference_stats"]
    assert stats["chosen_reward_sum"].item() == pytest.approx(rewards[0] + rewards[2])
    assert stats["rejected_reward_sum"].item() == pytest.approx(rewards[1] + rewards[3])
    assert stats["correct"].item() == (rewards[0] > rewards[1]) + (rewards[2] > rewards[3])


@pytest.mark.parametrize(
    "make",
    [
        lambda: SimPOLoss(beta=0),
        lambda: SimPOLoss(gamma=-1),
        lambda: CPOLoss(alpha=-1),
        lambda: ORPOLoss(beta=math.inf),
        lambda: DPOLoss(beta=math.nan),
    ],
)
def test_bad_preference_hyperparameters(make):
    with pytest.raises(ValueError, match="beta|gamma|alpha"):
        make()


def test_odd_rows_are_refused():
    labels, logps = pair_batch()
    with pytest.raises(ValueError, match="pairs on consecutive rows, so an even number"):
        SimPOLoss()({"labels": labels[:3]}, {"logps": logps[:3]})
