"""DecoupledPPOLoss (decoupled PPO for stale rollouts) against a float64 loop written token by
token from the formula (Hilton et al. 2022; AReaL): values, gradients, truncation, masks and
uneven lengths, micro-batches against one batch, GRPOLoss exactly when the proximal policy is
the behaviour policy, its reported weights, and through TransformersModel."""

import pytest
import torch

from twinkle.loss import DecoupledPPOLoss, GRPOLoss, build_loss
from twinkle.metric import PolicyMetric

B, T = 3, 7


def make_batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 50, (B, T), generator=gen)
    labels[:, :2] = -100
    labels[1, 5:] = -100  # uneven lengths: 2, 3 and 5 completion tokens
    labels[0, 4:] = -100
    logps = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    prox = logps + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    old = prox + 0.8 * torch.randn(B, T, generator=gen, dtype=torch.float64)  # stale sampler
    ref = logps + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    return labels, logps, prox, old, ref, adv


def label_tokens(labels):
    return [(b, t) for b in range(B) for t in range(T) if labels[b, t] != -100]


def reference(labels, logps, prox, old, ref, adv, eps_low, eps_high, cap, beta=0.0):
    """The decoupled objective, one token at a time, and its gradient by autograd."""
    leaf = logps.clone().requires_grad_()
    total = leaf.new_zeros(())
    for b, t in label_tokens(labels):
        a = adv[b] if adv.ndim == 1 else adv[b, t]
        weight = torch.exp(prox[b, t] - old[b, t])  # pi_prox / pi_behaviour, no gradient
        if cap is not None:
            weight = torch.clamp(weight, max=cap)
        r = torch.exp(leaf[b, t] - prox[b, t])  # pi_theta / pi_prox
        surrogate = torch.minimum(r * a, torch.clamp(r, 1 - eps_low, 1 + eps_high) * a)
        total = total - weight * surrogate
        if beta:
            log_r = ref[b, t] - leaf[b, t]
            total = total + beta * (torch.exp(log_r) - 1 - log_r)  # k3
    total.backward()
    return total, leaf.grad


def run(loss, labels, logps, **kwargs):
    leaf = logps.clone().requires_grad_()
    out = loss({"labels": labels}, {"logps": leaf}, **kwargs)
    out["loss"].backward()
    return out, leaf.grad


@pytest.mark.parametrize(
    ("eps_high", "cap", "beta", "per_token"),
    [(0.2, 5.0, 0.0, False), (0.28, 1.5, 0.1, False), (0.2, None, 0.0, True)],
)
def test_values_and_gradients_match_the_formula(eps_high, cap, beta, per_token):
    labels, logps, prox, old, ref, adv = make_batch()
    if per_token:
        adv = torch.randn(B, T, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    loss = DecoupledPPOLoss(0.2, eps_high, beta=beta, max_weight=cap)
    kw = dict(advantages=adv, old_logps=old, prox_logps=prox)
    out, grad = run(loss, labels, logps, ref_logps=ref, **kw)
    value, expected = reference(labels, logps, prox, old, ref, adv, 0.2, eps_high, cap, beta)
    assert out["num_tokens"].item() == len(label_tokens(labels)) == 10
    assert out["loss"].item() == pytest.approx(value.item(), rel=1e-12)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)
    assert bool((grad[labels == -100] == 0).all())
    assert bool((grad[labels != -100] != 0).any())


def test_the_proximal_policy_equal_to_the_behaviour_policy_is_grpo_exactly():
    labels, logps, _, old, ref, adv = make_batch()
    kw = dict(advantages=adv, old_logps=old, ref_logps=ref)
    ours, our_grad = run(DecoupledPPOLoss(0.2, 0.28, beta=0.1), labels, logps, prox_logps=old, **kw)
    grpo, grpo_grad = run(GRPOLoss(0.2, 0.28, beta=0.1), labels, logps, **kw)
    assert ours["loss"].item() == grpo["loss"].item()
    assert torch.equal(our_grad, grpo_grad)
    for key, value in grpo["policy_stats"].items():
        assert torch.equal(ours["policy_stats"][key], value), key
    assert ours["policy_stats"]["is_weight_sum"].item() == 10  # every weight exactly 1
    assert ours["policy_stats"]["is_truncated"].item() == 0


def test_a_stale_batch_keeps_the_gradient_grpo_clips_away():
    """The current policy is the proximal one (the first pass on a batch): every proximal
    ratio is 1, so no token is clipped. Against the stale sampler GRPOLoss's ratio is e^-1:
    with positive advantages its gradient is the same (-e^-1 A a token); with negative ones
    it is below 1 - epsilon, clipped, and every token's gradient is lost."""
    labels, logps, _, old, _, adv = make_batch()
    stale = logps + 1.0  # the sampler gave every token e times the current probability
    kw = dict(advantages=adv.abs(), old_logps=stale)
    ours, our_grad = run(DecoupledPPOLoss(max_weight=None), labels, logps, prox_logps=logps, **kw)
    grpo, grpo_grad = run(GRPOLoss(), labels, logps, **kw)
    assert grpo["policy_stats"]["clipped"].item() == 0
    # Decoupled: each token's gradient is -w * A with w = pi_prox / pi_behaviour = e^-1.
    mask = labels != -100
    expected = -torch.exp(torch.tensor(-1.0, dtype=torch.float64)) * adv.abs()[:, None]
    torch.testing.assert_close(our_grad[mask], expected.expand(B, T)[mask], rtol=1e-12, atol=0)
    assert ours["policy_stats"]["clipped"].item() == 0
    torch.testing.assert_close(our_grad, grpo_grad, rtol=1e-12, atol=0)
    # With negative advantages GRPO's stale ratio (below 1 - epsilon) clips every token.
    kw["advantages"] = -adv.abs()
    grpo, grpo_grad = run(GRPOLoss(), labels, logps, **kw)
    ours, our_grad = run(DecoupledPPOLoss(max_weight=None), labels, logps, prox_logps=logps, **kw)
    assert grpo["policy_stats"]["clipped"].item() == 10 and bool((grpo_grad == 0).all())
    assert bool((our_grad[mask] > 0).all()) and ours["policy_stats"]["clipped"].item() == 0


def test_truncated_weights_are_capped_counted_and_reported():
    labels, logps, prox, _, _, adv = make_batch()
    old = prox.clone()
    old[2, 3] = prox[2, 3] - 3.0  # weight e^3 ~ 20: truncated at 2
    old[1, 2] = prox[1, 2] - 0.5  # weight e^0.5 ~ 1.65: kept
    loss = DecoupledPPOLoss(max_weight=2.0)
    out, grad = run(loss, labels, logps, advantages=adv, old_logps=old, prox_logps=prox)
    value, expected = reference(labels, logps, prox, old, None, adv, 0.2, 0.2, 2.0)
    assert out["loss"].item() == pytest.approx(value.item(), rel=1e-12)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)
    stats = out["policy_stats"]
    assert stats["is_truncated"].item() == 1
    assert stats["is_weight_max"].item() == 2.0
    weights = 8 + 2.0 + torch.exp(torch.tensor(0.5, dtype=torch.float64)).item()
    assert stats["is_weight_sum"].item() == pytest.approx(weights, rel=1e-12)
    metric = PolicyMetric()
    metric.accumulate({"labels": labels}, out)
    report = metric.calculate()
    assert report["policy/is_truncated_fraction"] == pytest.approx(0.1)
    assert report["policy/is_weight_mean"] == pytest.approx(weights / 10)
    assert report["policy/is_weight_max"] == 2.0
    grpo = GRPOLoss()({"labels": labels}, {"logps": logps}, advantages=adv, old_logps=old)
    metric.reset()
    metric.accumulate({"labels": labels}, grpo)
    assert not any(k.startswith("policy/is_") for k in metric.calculate())


def test_micro_batches_accumulate_to_one_batch():
    labels, logps, prox, old, ref, adv = make_batch()
    loss = build_loss("DecoupledPPOLoss", beta=0.1, max_weight=1.5)
    kw = dict(advantages=adv, old_logps=old, prox_logps=prox, ref_logps=ref)
    whole, whole_grad = run(loss, labels, logps, **kw)
    parts, grads = [], []
    for rows in (slice(0, 1), slice(1, 3)):
        out, g = run(loss, labels[rows], logps[rows], **{k: v[rows] for k, v in kw.items()})
        parts.append(out)
        grads.append(g)
    total = sum(p["num_tokens"].item() for p in parts)
    summed = sum(p["loss"].item() for p in parts) / total
    assert summed == pytest.approx(whole["loss"].item() / whole["num_tokens"].item(), rel=1e-12)
    torch.testing.assert_close(torch.cat(grads), whole_grad, rtol=1e-12, atol=1e-12)


def test_sampler_style_lists_equal_aligned_tensors():
    labels, logps, prox, old, _, adv = make_batch()
    mask = labels != -100

    def rows(x):
        return [x[b][mask[b]].tolist() for b in range(B)]

    loss = DecoupledPPOLoss()
    tensors, _ = run(loss, labels, logps, advantages=adv, old_logps=old, prox_logps=prox)
    lists, _ = run(loss, labels, logps, advantages=adv, old_logps=rows(old), prox_logps=rows(prox))
    assert lists["loss"].item() == pytest.approx(tensors["loss"].item(), rel=1e-12)


def test_missing_inputs_and_bad_arguments_say_what_to_pass():
    labels, logps, prox, old, _, adv = make_batch()
    loss = DecoupledPPOLoss()
    with pytest.raises(ValueError, match=r"needs prox_logps: .*model\.policy_logps\(inputs\)"):
        loss({"labels": labels}, {"logps": logps}, advantages=adv, old_logps=old)
    with pytest.raises(ValueError, match=r"needs old_logps: .*sampling policy"):
        loss({"labels": labels}, {"logps": logps}, advantages=adv, prox_logps=prox)
    with pytest.raises(ValueError, match=r"prox_logps has shape \(3, 6\)"):
        loss({"labels": labels}, {"logps": logps}, advantages=adv, old_logps=old,
             prox_logps=prox[:, 1:])  # fmt: skip
    bad = prox.clone()
    bad[1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"prox_logps\[1\] holds NaN"):
        loss({"labels": labels}, {"logps": logps}, advantages=adv, old_logps=old, prox_logps=bad)
    for cap in (0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="max_weight must be a finite number >= 1"):
            DecoupledPPOLoss(max_weight=cap)
    with pytest.raises(ValueError, match="epsilon must lie in"):
        DecoupledPPOLoss(epsilon=1.5)


def test_through_the_model_prox_from_policy_logps_and_micro_batches():
    """TransformersModel hands prox_logps to the loss like old_logps: lists per sequence are
    aligned before the batch is cut, and two micro-batches train as one batch."""
    from twinkle.model import TransformersModel

    gen = torch.Generator().manual_seed(0)
    rows = []
    for prompt, length in ((3, 9), (5, 8), (2, 10)):
        ids = torch.randint(1, 3000, (length,), generator=gen).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    grads = []
    for micro in (None, 2):
        model = TransformersModel("bundled://tiny-qwen3", device="cpu", seed=0)
        model.set_loss("DecoupledPPOLoss", max_weight=2.0)
        model.set_optimizer("SGD", lr=0.0)
        prox = model.policy_logps(rows)
        labels = [torch.tensor(r["labels"]) for r in rows]
        prox_rows = [prox[i, : len(lab)][lab != -100].tolist() for i, lab in enumerate(labels)]
        old_rows = [[v - 0.4 * (j % 3) for j, v in enumerate(row)] for row in prox_rows]
        model.forward_backward(
            rows, advantages=[1.0, -0.5, 0.7], old_logps=old_rows, prox_logps=prox_rows,
            micro_batch_size=micro,
        )  # fmt: skip
        metrics = model.calculate_metric(is_training=True)
        grads.append(torch.cat([p.grad.flatten() for p in model.model.parameters()]))
        assert metrics["policy/is_truncated_fraction"] > 0  # weights e^0.8 > 2 were truncated
        assert metrics["policy/clip_fraction"] >= metrics["policy/is_truncated_fraction"]
    scale = float(grads[0].abs().max())
    assert scale > 0
    # float32 sums in another order (the micro-batches pack differently; measured 4.4e-7 of
    # the largest gradient): 1e-5 of it; a row cut from the wrong prox or old logps moves
    # whole gradients.
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-5 * scale)
