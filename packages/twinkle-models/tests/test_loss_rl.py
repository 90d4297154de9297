"""GRPO, GSPO and CISPO against per-token float64 loops, including the clip regions."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.loss import CISPOLoss, GRPOLoss, GSPOLoss

B, T = 3, 6


def make_batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 50, (B, T), generator=gen)
    labels[:, :2] = -100  # prompts
    labels[1, 5] = -100  # padding after a shorter completion
    logps = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3
    old = logps + 0.4 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    ref = logps + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    advantages = torch.randn(B, generator=gen, dtype=torch.float64)
    return labels, logps, old, ref, advantages


def label_tokens(labels):
    return [
        (b, t)
        for b in range(labels.shape[0])
        for t in range(1, labels.shape[1])
        if labels[b, t] != -100
    ]


def grpo_loop(logps, old, ref, adv, labels, eps, eps_high, beta):
    total = logps.new_zeros(())
    for b, t in label_tokens(labels):
        a = adv[b] if adv.ndim == 1 else adv[b, t]
        ratio = torch.exp(logps[b, t] - old[b, t])
        clipped = min(
            max(ratio, torch.tensor(1 - eps, dtype=torch.float64)),
            torch.tensor(1 + eps_high, dtype=torch.float64),
        )
        total = total - min(ratio * a, clipped * a)
        if beta:
            d = ref[b, t] - logps[b, t]
            total = total + beta * (torch.exp(d) - d - 1)
    return total


def run(loss, labels, logps, **kwargs):
    leaf = logps.clone().requires_grad_()
    out = loss({"labels": labels}, {"logps": leaf}, **kwargs)
    out["loss"].backward()
    return out, leaf.grad


def loop_grad(fn, logps):
    leaf = logps.clone().requires_grad_()
    value = fn(leaf)
    value.backward()
    return value, leaf.grad


@pytest.mark.parametrize(("eps", "eps_high", "beta"), [(0.2, None, 0.0), (0.1, 0.28, 0.05)])
@pytest.mark.parametrize("per_token", [False, True])
def test_grpo_matches_loop(eps, eps_high, beta, per_token):
    labels, logps, old, ref, adv = make_batch()
    if per_token:
        adv = torch.randn(B, T, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out, grad = run(
        GRPOLoss(eps, eps_high, beta), labels, logps, advantages=adv, old_logps=old, ref_logps=ref
    )
    high = eps if eps_high is None else eps_high
    value, ref_grad = loop_grad(
        lambda lp: grpo_loop(lp, old, ref, adv, labels, eps, high, beta), logps
    )
    assert out["num_tokens"].item() == len(label_tokens(labels)) == 11
    assert out["loss"].item() == pytest.approx(value.item(), rel=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)


def test_grpo_gradient_in_each_clip_region():
    """d loss / d logp is -A * ratio where the unclipped term is the minimum, 0 where the
    clipped one is: ratio above or below the range, with either sign of advantage."""
    cases = [  # (ratio, advantage, clip bites?)
        (1.5, 1.0, True),  # too likely already, positive advantage: no further push
        (1.5, -1.0, False),  # too likely, negative advantage: pushed down
        (0.5, 1.0, False),  # too unlikely, positive advantage: pushed up
        (0.5, -1.0, True),  # too unlikely, negative advantage: no further push
        (1.1, 2.0, False),  # inside the range
        (1.25, 2.0, False),  # inside thanks to epsilon_high = 0.3
    ]
    labels = torch.tensor([[-100] + [1] * len(cases)])
    logps = torch.tensor([[0.0] + [-1.0] * len(cases)], dtype=torch.float64)
    old = logps.clone()
    old[0, 1:] -= torch.log(torch.tensor([c[0] for c in cases], dtype=torch.float64))
    adv = torch.tensor([[0.0] + [c[1] for c in cases]], dtype=torch.float64)
    _, grad = run(GRPOLoss(0.2, 0.3), labels, logps, advantages=adv, old_logps=old)
    for i, (ratio, a, clipped) in enumerate(cases, start=1):
        expected = 0.0 if clipped else -a * ratio
        assert grad[0, i].item() == pytest.approx(expected, rel=1e-12, abs=1e-15), (ratio, a)


def test_grpo_without_old_logps_is_on_policy():
    labels, logps, _, _, adv = make_batch()
    out, grad = run(GRPOLoss(), labels, logps, advantages=adv)
    tokens = label_tokens(labels)
    assert out["loss"].item() == pytest.approx(-sum(adv[b].item() for b, _ in tokens))
    for b, t in tokens:
        assert grad[b, t].item() == pytest.approx(-adv[b].item())
    assert grad[:, :2].abs().sum() == 0


def test_sampler_style_old_logps_lists_are_aligned_to_the_label_tokens():
    labels, logps, old, _, adv = make_batch()
    ragged = [[old[b, t].item() for bb, t in label_tokens(labels) if bb == b] for b in range(B)]
    aligned, _ = run(GRPOLoss(), labels, logps, advantages=adv.tolist(), old_logps=old)
    from_lists, _ = run(GRPOLoss(), labels, logps, advantages=adv.tolist(), old_logps=ragged)
    assert from_lists["loss"].item() == pytest.approx(aligned["loss"].item(), rel=1e-12)
    ragged[1] = ragged[1][:-1]
    with pytest.raises(ValueError, match=r"old_logps\[1\] has 2 values but row 1 .* has 3 label"):
        run(GRPOLoss(), labels, logps, advantages=adv, old_logps=ragged)


def test_the_samplers_token_logprob_pairs_are_read_as_their_sampled_logprobs():
    """``seq.logprobs`` as a row: per token, ``(token_id, logprob)`` pairs with the sampled
    token first; lists, JSON-decoded lists or an (n, k, 2) array give the flat row's loss."""
    labels, logps, old, _, adv = make_batch()
    tokens = label_tokens(labels)
    flat = [[old[b, t].item() for bb, t in tokens if bb == b] for b in range(B)]
    pairs = [
        [((int(labels[b, t]), old[b, t].item()), (7, -9.0)) for bb, t in tokens if bb == b]
        for b in range(B)
    ]
    as_json = [[[list(p) for p in position] for position in row] for row in pairs]
    arrays = [torch.tensor(row, dtype=torch.float64) for row in as_json]
    expected, _ = run(GRPOLoss(), labels, logps, advantages=adv, old_logps=flat)
    for rows in (pairs, as_json, arrays):
        out, _ = run(GRPOLoss(), labels, logps, advantages=adv, old_logps=rows)
        assert out["loss"].item() == expected["loss"].item()
    # Another row's pairs (other tokens): refused, naming the row and the first token that differs.
    wrong = [pairs[0], [((int(labels[1, 2]) + 1, -1.0), *p[1:]) for p in pairs[1]], pairs[2]]
    with pytest.raises(ValueError, match=r"old_logps\[1\] holds the sampler's logprobs of other"):
        run(GRPOLoss(), labels, logps, advantages=adv, old_logps=wrong)
    with pytest.raises(ValueError, match=r"old_logps\[2\] has shape \(\d+, 2\); give"):
        run(GRPOLoss(), labels, logps, advantages=adv, old_logps=[*arrays[:2], arrays[2][:, 0]])


def test_fields_may_come_from_inputs_but_not_twice():
    labels, logps, old, _, adv = make_batch()
    via_kwargs, _ = run(GRPOLoss(), labels, logps, advantages=adv, old_logps=old)
    out = GRPOLoss()({"labels": labels, "advantages": adv, "old_logps": old}, {"logps": logps})
    assert out["loss"].item() == pytest.approx(via_kwargs["loss"].item(), rel=1e-12)
    with pytest.raises(ValueError, match="both in inputs and as a keyword"):
        GRPOLoss()({"labels": labels, "advantages": adv}, {"logps": logps}, advantages=adv)


@pytest.mark.parametrize(
    ("loss", "kwargs", "message"),
    [
        (GRPOLoss(), {}, r"needs advantages: pass forward_backward\(\.\.\., advantages="),
        (GRPOLoss(beta=0.1), {"advantages": [1.0, 2.0, 3.0]}, "needs ref_logps"),
        (GRPOLoss(), {"advantages": [1.0, 2.0]}, "2 values but the batch has 3"),
        (GRPOLoss(), {"advantages": torch.zeros(B, T + 1)}, r"shape \(3, 7\)"),
        (GSPOLoss(), {"advantages": torch.zeros(B, T)}, "one advantage per sequence"),
        (CISPOLoss(), {}, "needs advantages"),
    ],
)
def test_bad_rl_inputs_say_what_to_pass(loss, kwargs, message):
    labels, logps, *_ = make_batch()
    with pytest.raises(ValueError, match=message):
        loss({"labels": labels}, {"logps": logps}, **kwargs)


def test_no_label_tokens_is_an_error():
    labels, logps, _, _, adv = make_batch()
    with pytest.raises(ValueError, match="no label tokens"):
        GRPOLoss()({"labels": torch.full_like(labels, -100)}, {"logps": logps}, advantages=adv)


@pytest.mark.parametrize(
    "make",
    [
        lambda: GRPOLoss(epsilon=1.5),
        lambda: GRPOLoss(beta=-1),
        lambda: GSPOLoss(0.0),
        lambda: CISPOLoss(epsilon_high=0),
        lambda: CISPOLoss(epsilon_low=2.0),
    ],
)
def test_bad_hyperparameters_are_rejected(make):
    with pytest.raises(ValueError):
        make()


def gspo_loop(logps, old, adv, labels, eps, eps_high):
    total = logps.new_zeros(())
    for b in range(labels.shape[0]):
        tokens = [t for bb, t in label_tokens(labels) if bb == b]
        if not tokens:
            continue
        mean_log_ratio = sum(logps[b, t] - old[b, t] for t in tokens) / len(tokens)
        s = torch.exp(mean_log_ratio)
        clipped = min(
            max(s, torch.tensor(1 - eps, dtype=torch.float64)),
            torch.tensor(1 + eps_high, dtype=torch.float64),
        )
        total = total - min(s * adv[b], clipped * adv[b])
    return total


@pytest.mark.parametrize(("eps", "eps_high"), [(3e-4, 4e-4), (0.2, 0.2)])
def test_gspo_matches_loop_and_counts_sequences(eps, eps_high):
    labels, logps, old, _, adv = make_batch()
    labels[2, 2:] = -100  # a row with no label tokens is not counted
    old[0] = logps[0] + 1e-4  # keep one sequence inside the narrow range
    out, grad = run(GSPOLoss(eps, eps_high), labels, logps, advantages=adv, old_logps=old)
    value, ref_grad = loop_grad(lambda lp: gspo_loop(lp, old, adv, labels, eps, eps_high), logps)
    assert out["num_tokens"].item() == 2
    assert out["loss"].item() == pytest.approx(value.item(), rel=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)
    assert grad[0].abs().sum() > 0


def test_cispo_keeps_the_gradient_of_clipped_tokens_with_a_capped_weight():
    labels = torch.tensor([[-100, 1, 1, 1, 1]])
    logps = torch.tensor([[0.0, -1.0, -2.0, -0.5, -1.5]], dtype=torch.float64)
    ratios = [8.0, 1.5, 0.2, 0.9]
    old = logps.clone()
    old[0, 1:] -= torch.log(torch.tensor(ratios, dtype=torch.float64))
    adv = torch.tensor([-0.7], dtype=torch.float64)
    for eps_low, weights in [(None, [4.0, 1.5, 0.2, 0.9]), (0.5, [4.0, 1.5, 0.5, 0.9])]:
        out, grad = run(
            CISPOLoss(epsilon_high=3.0, epsilon_low=eps_low),
            labels,
            logps,
            advantages=adv,
            old_logps=old,
        )
        expected = sum(-w * adv.item() * logps[0, i + 1].item() for i, w in enumerate(weights))
        assert out["loss"].item() == pytest.approx(expected, rel=1e-12)
        assert out["num_tokens"].item() == 4
        for i, w in enumerate(weights):
            assert grad[0, i + 1].item() == pytest.approx(-w * adv.item(), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(-3, 0), min_size=5, max_size=5),
    st.lists(st.floats(-0.7, 0.7), min_size=5, max_size=5),
    st.floats(-2, 2),
    st.floats(0.05, 0.5),
)
def test_grpo_token_terms_follow_the_formula(logps, shifts, advantage, eps):
    labels = torch.tensor([[-100, 4, 4, 4, 4, 4]])
    lp = torch.tensor([[0.0, *logps]], dtype=torch.float64)
    old = torch.tensor(
        [[0.0] + [a - s for a, s in zip(logps, shifts, strict=True)]], dtype=torch.float64
    )
    out = GRPOLoss(eps)({"labels": labels}, {"logps": lp}, advantages=[advantage], old_logps=old)
    expected = 0.0
    for s in shifts:
        ratio = math.exp(s)
        expected -= min(ratio * advantage, min(max(ratio, 1 - eps), 1 + eps) * advantage)
    assert out["loss"].item() == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_advantages_or_old_logps_are_refused_naming_the_row(bad):
    """One NaN or infinite value where the loss reads it would make the loss, and after the
    step every trained weight, NaN; off the label tokens it is never read and is allowed."""
    labels, logps, old, _, adv = make_batch()
    poisoned = adv.clone()
    poisoned[2] = bad
    with pytest.raises(ValueError, match=r"advantages\[2\] holds NaN or an infinite value"):
        GRPOLoss()({"labels": labels}, {"logps": logps}, advantages=poisoned, old_logps=old)
    rows = [old[b][labels[b] != -100].tolist() for b in range(B)]
    rows[1][0] = bad
    with pytest.raises(ValueError, match=r"old_logps\[1\] holds NaN or an infinite value"):
        GRPOLoss()({"labels": labels}, {"logps": logps}, advantages=adv, old_logps=rows)
    off_labels = old.clone()
    off_labels[0, 0] = bad  # a prompt position: no loss term reads it
    out = GRPOLoss()({"labels": labels}, {"logps": logps}, advantages=adv, old_logps=off_labels)
    assert torch.isfinite(out["loss"])
