"""DPOLoss against a pair-by-pair float64 computation."""

import pytest
import torch

from twinkle.loss import DPOLoss

B, T = 4, 6  # two (chosen, rejected) pairs


def make_batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 50, (B, T), generator=gen)
    labels[:, :2] = -100
    labels[3, 4:] = -100
    logps = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 2
    ref = logps + 0.5 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    return labels, logps, ref


def sequence_sum(values, labels, b):
    return sum(values[b, t] for t in range(1, T) if labels[b, t] != -100)


def dpo_loop(logps, ref, labels, beta, loss_type, smoothing):
    total = 0.0
    for pair in range(B // 2):
        c, r = 2 * pair, 2 * pair + 1
        h = (sequence_sum(logps, labels, c) - sequence_sum(ref, labels, c)) - (
            sequence_sum(logps, labels, r) - sequence_sum(ref, labels, r)
        )
        if loss_type == "sigmoid":
            z = beta * h
            total = total + (1 - smoothing) * torch.log1p(torch.exp(-z))
            total = total + smoothing * torch.log1p(torch.exp(z))
        elif loss_type == "ipo":
            total = total + (h - 1 / (2 * beta)) ** 2
        else:
            total = total + max(1 - beta * h, torch.zeros((), dtype=torch.float64))
    return total


@pytest.mark.parametrize(
    ("loss_type", "beta", "smoothing"),
    [("sigmoid", 0.1, 0.0), ("sigmoid", 0.5, 0.2), ("ipo", 0.3, 0.0), ("hinge", 2.0, 0.0)],
)
def test_dpo_matches_loop(loss_type, beta, smoothing):
    labels, logps, ref = make_batch()
    leaf = logps.clone().requires_grad_()
    out = DPOLoss(beta, loss_type, smoothing)({"labels": labels}, {"logps": leaf}, ref_logps=ref)
    out["loss"].backward()
    ref_leaf = logps.clone().requires_grad_()
    expected = dpo_loop(ref_leaf, ref, labels, beta, loss_type, smoothing)
    expected.backward()
    assert out["num_tokens"].item() == 2
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-12)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=1e-12, atol=1e-12)
    assert leaf.grad[:, :2].abs().sum() == 0


def test_hinge_is_flat_once_the_margin_is_met():
    labels = torch.tensor([[-100, 1], [-100, 1]])
    logps = torch.tensor([[0.0, -0.1], [0.0, -5.0]], dtype=torch.float64, requires_grad=True)
    out = DPOLoss(beta=1.0, loss_type="hinge")(
        {"labels": labels}, {"logps": logps}, ref_logps=[0.0, 0.0]
    )
    out["loss"].backward()
    assert out["loss"].item() == 0.0
    assert logps.grad.abs().sum() == 0


def test_reference_may_be_per_sequence_sums_or_sampler_lists():
    labels, logps, ref = make_batch()
    sums = [sequence_sum(ref, labels, b).item() for b in range(B)]
    lists = [[ref[b, t].item() for t in range(1, T) if labels[b, t] != -100] for b in range(B)]
    loss = DPOLoss()
    expected = loss({"labels": labels}, {"logps": logps}, ref_logps=ref)["loss"].item()
    for given in (sums, torch.tensor(sums, dtype=torch.float64), lists):
        got = loss({"labels": labels, "ref_logps": given}, {"logps": logps})["loss"].item()
        assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("make_labels", "kwargs", "message"),
    [
        (lambda lb: lb[:3], {"ref_logps": [0.0] * 3}, "even number of rows"),
        (lambda lb: lb, {}, "needs ref_logps"),
        (
            lambda lb: torch.cat([lb[:3], torch.full((1, T), -100)]),
            {"ref_logps": [0.0] * 4},
            r"rows \[3\] have no label tokens",
        ),
    ],
)
def test_bad_inputs_say_what_is_wrong(make_labels, kwargs, message):
    labels, logps, _ = make_batch()
    labels = make_labels(labels)
    with pytest.raises(ValueError, match=message):
        DPOLoss()({"labels": labels}, {"logps": logps[: labels.shape[0]]}, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"beta": 0},
        {"loss_type": "kto"},
        {"label_smoothing": 0.6},
        {"loss_type": "ipo", "label_smoothing": 0.1},
    ],
)
def test_bad_hyperparameters_are_rejected(kwargs):
    with pytest.raises(ValueError):
        DPOLoss(**kwargs)
