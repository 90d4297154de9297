"""SAPO, BNPO, Dr. GRPO, PPO and the KL estimators against float64 loops written token by
token from the papers' formulas; micro-batches and accumulation against one batch."""

import pytest
import torch

from twinkle.loss import (
    BNPOLoss,
    CISPOLoss,
    DRGRPOLoss,
    GRPOLoss,
    PPOLoss,
    SAPOLoss,
    build_loss,
    kl_estimate,
)

B, T = 3, 7


def make_batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 50, (B, T), generator=gen)
    labels[:, :2] = -100
    labels[1, 5:] = -100  # uneven lengths: 2, 3 and 5 completion tokens
    labels[0, 4:] = -100
    logps = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    old = logps + 0.5 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    ref = logps + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    return labels, logps, old, ref, adv


def tokens(labels):
    return [
        (b, t)
        for b in range(labels.shape[0])
        for t in range(1, labels.shape[1])
        if labels[b, t] != -100
    ]


def kl_term(lp, rf, estimator):
    # Written from Schulman's notes with r = ref / policy probabilities.
    log_r = rf - lp
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return log_r * log_r / 2
    return torch.exp(log_r) - 1 - log_r


def clipped_term(lp, od, a, low, high):
    r = torch.exp(lp - od)
    return -torch.minimum(r * a, torch.clamp(r, low, high) * a)


def sapo_term(lp, od, a, tau_pos, tau_neg):
    r = torch.exp(lp - od)
    tau = tau_pos if a > 0 else tau_neg
    return -(4.0 / tau) / (1 + torch.exp(-tau * (r - 1))) * a


def loop(term, labels, logps, old, ref, adv, beta=0.0, estimator="k3"):
    def total(leaf):
        s = leaf.new_zeros(())
        for b, t in tokens(labels):
            s = s + term(leaf[b, t], old[b, t], adv[b])
            if beta:
                s = s + beta * kl_term(leaf[b, t], ref[b, t], estimator)
        return s

    leaf = logps.clone().requires_grad_()
    value = total(leaf)
    value.backward()
    return value, leaf.grad


def run(loss, labels, logps, **kwargs):
    leaf = logps.clone().requires_grad_()
    out = loss({"labels": labels}, {"logps": leaf}, **kwargs)
    out["loss"].backward()
    return out, leaf.grad


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_grpo_kl_estimators_match_the_loop(estimator):
    labels, logps, old, ref, adv = make_batch()
    loss = GRPOLoss(0.2, 0.28, beta=0.1, kl_estimator=estimator)
    out, grad = run(loss, labels, logps, advantages=adv, old_logps=old, ref_logps=ref)
    value, expected = loop(
        lambda lp, od, a: clipped_term(lp, od, a, 0.8, 1.28),
        labels,
        logps,
        old,
        ref,
        adv,
        beta=0.1,
        estimator=estimator,
    )
    assert out["loss"].item() == pytest.approx(value.item(), rel=1e-12)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)
    mask = torch.zeros_like(labels, dtype=torch.bool)
    for b, t in tokens(labels):
        mask[b, t] = True
    kl = kl_estimate(logps, ref, estimator)[mask].sum()
    assert out["policy_stats"]["ref_kl_sum"].item() == pytest.approx(kl.item(), rel=1e-12)


def test_k3_is_nonnegative_and_k1_k3_agree_in_expectation():
    """Sampled from the policy, k1 and k3 are unbiased estimates of the same KL."""
    gen = torch.Generator().manual_seed(3)
    policy = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    true_kl = (policy * (policy / ref).log()).sum().item()
    draws = torch.multinomial(policy, 200_000, replacement=True, generator=gen)
    lp, rf = policy.log()[draws], ref.log()[draws]
    for est in ("k1", "k3"):
        assert kl_estimate(lp, rf, est).mean().item() == pytest.approx(true_kl, abs=5e-3)
    assert bool((kl_estimate(lp, rf, "k3") >= 0).all())


def test_sapo_matches_the_loop_and_is_grpo_on_policy():
    labels, logps, old, ref, adv = make_batch()
    out, grad = run(
        SAPOLoss(1.0, 1.05, beta=0.05), labels, logps, advantages=adv, old_logps=old, ref_logps=ref
    )
    value, expected = loop(
        lambda lp, od, a: sapo_term(lp, od, a, 1.0, 1.05), labels, logps, old, ref, adv, beta=0.05
    )
    assert out["loss"].item() == pytest.approx(value.item(), rel=1e-12)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)
    # On policy (ratio 1) the gate's slope is 1: the gradient is GRPO's, -A per token.
    _, sapo_grad = run(SAPOLoss(2.0, 3.0), labels, logps, advantages=adv)
    _, grpo_grad = run(GRPOLoss(), labels, logps, advantages=adv)
    torch.testing.assert_close(sapo_grad, grpo_grad, rtol=1e-12, atol=1e-12)


def test_sapo_damps_far_ratios_smoothly():
    labels = torch.tensor([[-100, 1, 1, 1]])
    logps = torch.zeros(1, 4, dtype=torch.float64)
    old = -torch.log(torch.tensor([[1.0, 1.0, 1.5, 4.0]], dtype=torch.float64))
    out, grad = run(SAPOLoss(), labels, logps, advantages=[1.0], old_logps=old)
    ratios = torch.tensor([1.0, 1.5, 4.0], dtype=torch.float64)
    gate = -grad[0, 1:] / ratios  # d loss / d logp = -4 s (1 - s) * r * A, with A = 1
    assert gate[0].item() == pytest.approx(1.0)
    assert 1 > gate[1].item() > 0.5 > gate[2].item() > 0  # decays smoothly, never zero
    assert out["policy_stats"]["clipped"].item() == 1  # only r = 4 is damped below half


def test_bnpo_and_drgrpo_normalisers():
    labels, logps, old, ref, adv = make_batch()
    value, expected = loop(
        lambda lp, od, a: clipped_term(lp, od, a, 0.8, 1.2), labels, logps, old, ref, adv
    )
    n = len(tokens(labels))
    out, grad = run(BNPOLoss(), labels, logps, advantages=adv, old_logps=old)
    assert out["num_tokens"].item() == 1
    assert out["loss"].item() == pytest.approx(value.item() / n, rel=1e-12)
    torch.testing.assert_close(grad, expected / n, rtol=1e-12, atol=1e-12)
    out, grad = run(
        DRGRPOLoss(max_completion_length=8), labels, logps, advantages=adv, old_logps=old
    )
    assert out["num_tokens"].item() == B * 8
    assert out["loss"].item() == pytest.approx(value.item(), rel=1e-12)
    with pytest.raises(ValueError, match=r"row 2 has 5 label tokens, more than max_completion"):
        DRGRPOLoss(max_completion_length=4)({"labels": labels}, {"logps": logps}, advantages=adv)


def test_ppo_requires_old_logps_and_dual_clip_bounds_negative_advantages():
    labels, logps, old, ref, adv = make_batch()
    with pytest.raises(ValueError, match="PPOLoss needs old_logps: pass old_logps, the sampling"):
        PPOLoss()({"labels": labels}, {"logps": logps}, advantages=adv)
    per_token_adv = (
        torch.randn(B, T, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 2
    )
    c = 1.5

    def dual(lp, od, a):
        term = clipped_term(lp, od, a, 0.8, 1.2)
        return torch.minimum(term, -c * a) if a < 0 else term

    def total(leaf):
        return sum(dual(leaf[b, t], old[b, t], per_token_adv[b, t]) for b, t in tokens(labels))

    leaf = logps.clone().requires_grad_()
    expected_value = total(leaf)
    expected_value.backward()
    out, grad = run(PPOLoss(dual_clip=c), labels, logps, advantages=per_token_adv, old_logps=old)
    assert out["loss"].item() == pytest.approx(expected_value.item(), rel=1e-12)
    torch.testing.assert_close(grad, leaf.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "name", ["GRPOLoss", "SAPOLoss", "BNPOLoss", "DRGRPOLoss", "PPOLoss", "CISPOLoss"]
)
def test_micro_batches_accumulate_to_one_batch(name):
    """Summed losses over summed normalisers, as the model divides them: two micro-batches
    (rows 0 and 1-2) give one batch's loss and gradient; BNPO weighs each batch equally, so
    it equals the mean of the two batches' means instead."""
    labels, logps, old, ref, adv = make_batch()
    loss = build_loss(name, beta=0.1) if name != "CISPOLoss" else CISPOLoss(beta=0.1)
    kw = dict(advantages=adv, old_logps=old, ref_logps=ref)
    whole, whole_grad = run(loss, labels, logps, **kw)
    parts, grads = [], []
    for rows in (slice(0, 1), slice(1, 3)):
        out, g = run(loss, labels[rows], logps[rows], **{k: v[rows] for k, v in kw.items()})
        parts.append(out)
        grads.append(g)
    total = sum(p["num_tokens"].item() for p in parts)
    summed = sum(p["loss"].item() for p in parts) / total
    if name == "BNPOLoss":
        assert total == 2
        assert whole["loss"].item() != pytest.approx(summed, rel=1e-6)
        return
    assert summed == pytest.approx(whole["loss"].item() / whole["num_tokens"].item(), rel=1e-12)
    torch.testing.assert_close(torch.cat(grads), whole_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "make",
    [
        lambda: SAPOLoss(tau_pos=0),
        lambda: SAPOLoss(tau_neg=float("nan")),
        lambda: GRPOLoss(beta=float("nan")),
        lambda: GRPOLoss(kl_estimator="k4"),
        lambda: DRGRPOLoss(max_completion_length=0),
        lambda: PPOLoss(dual_clip=1.0),
        lambda: PPOLoss(epsilon=0),
    ],
)
def test_bad_hyperparameters_name_the_argument(make):
    with pytest.raises(
        ValueError,
        match=r"tau_pos|tau_neg|beta|kl_estimator|max_completion|"
        r"dual_clip|epsilon",
    ):
        make()


def test_a_kl_without_a_reference_says_how_to_get_one():
    labels, logps, old, _, adv = make_batch()
    with pytest.raises(ValueError, match=r"needs ref_logps: .*reference_logps\(inputs\)"):
        SAPOLoss(beta=0.1)({"labels": labels}, {"logps": logps}, advantages=adv)


def test_nan_advantages_are_refused():
    labels, logps, *_ = make_batch()
    with pytest.raises(ValueError, match=r"advantages\[1\] holds NaN"):
        SAPOLoss()({"labels": labels}, {"logps": logps}, advantages=[0.0, float("nan"), 1.0])
