"""CrossEntropyLoss against a per-token float64 computation written out with loops."""

import math

import pytest
import torch

from twinkle.loss import CrossEntropyLoss

B, T, V = 3, 7, 11


def make_batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, V, (B, T), generator=gen)
    labels[0, 2:4] = -100  # a prompt span
    labels[1, 5] = -100
    labels[2, :] = -100  # a row outside the loss entirely
    labels[2, 6] = 3
    return logits, labels


def loop_reference(logits, labels):
    """Loss, per-position logps and argmax ids, one (b, t) at a time."""
    loss, count = 0.0, 0
    logps = [[0.0] * T for _ in range(B)]
    predicted = [[-100] * T for _ in range(B)]
    for b in range(B):
        for t in range(1, T):
            target = int(labels[b, t])
            if target == -100:
                continue
            row = [float(x) for x in logits[b, t - 1]]
            log_norm = math.log(sum(math.exp(x) for x in row))
            logps[b][t] = row[target] - log_norm
            predicted[b][t] = max(range(V), key=lambda v, row=row: row[v])
            loss -= logps[b][t]
            count += 1
    return loss, count, torch.tensor(logps, dtype=torch.float64), torch.tensor(predicted)


def loop_loss_tensor(logits, labels):
    """The same loss as a differentiable sum of per-token scalars, for gradients."""
    total = logits.new_zeros(())
    for b in range(B):
        for t in range(1, T):
            target = int(labels[b, t])
            if target != -100:
                row = logits[b, t - 1]
                total = total - (row[target] - torch.log(torch.exp(row).sum()))
    return total


def test_from_logits_matches_loop_including_metric_outputs():
    logits, labels = make_batch()
    out = CrossEntropyLoss()({"labels": labels}, {"logits": logits})
    loss, count, logps, predicted = loop_reference(logits, labels)
    assert out["loss"].item() == pytest.approx(loss, rel=1e-12)
    assert out["num_tokens"].item() == count == 10
    torch.testing.assert_close(out["logps"], logps, rtol=1e-12, atol=1e-12)
    assert torch.equal(out["predicted_ids"], predicted)
    assert not out["logps"].requires_grad


def test_first_position_is_never_predicted():
    logits, labels = make_batch()
    labels[:, 0] = 5  # HF-style labels often equal input_ids everywhere
    out = CrossEntropyLoss()({"labels": labels}, {"logits": logits})
    assert out["num_tokens"].item() == 10
    assert (out["logps"][:, 0] == 0).all()


def test_gradient_matches_loop():
    logits, labels = make_batch()
    leaf = logits.clone().requires_grad_()
    CrossEntropyLoss()({"labels": labels}, {"logits": leaf})["loss"].backward()
    ref_leaf = logits.clone().requires_grad_()
    loop_loss_tensor(ref_leaf, labels).backward()
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=1e-12, atol=1e-12)


def test_from_logps_ignores_values_off_the_labels():
    logits, labels = make_batch()
    _, _, logps, _ = loop_reference(logits, labels)
    noisy = logps.clone()
    noisy[labels == -100] = 123.0
    noisy[:, 0] = -7.0
    leaf = noisy.requires_grad_()
    out = CrossEntropyLoss()({"labels": labels.tolist()}, {"logps": leaf})
    assert out["loss"].item() == pytest.approx(-logps.sum().item(), rel=1e-12)
    assert "predicted_ids" not in out
    out["loss"].backward()
    expected = torch.zeros(B, T, dtype=torch.float64)
    expected[labels != -100] = -1.0
    expected[:, 0] = 0.0
    assert torch.equal(leaf.grad, expected)


def test_custom_ignore_index():
    logits, labels = make_batch()
    relabelled = torch.where(labels == -100, -1, labels)
    ours = CrossEntropyLoss(ignore_index=-1)({"labels": relabelled}, {"logits": logits})
    loss, count, _, _ = loop_reference(logits, labels)
    assert ours["num_tokens"].item() == count
    assert ours["loss"].item() == pytest.approx(loss, rel=1e-12)
    with pytest.raises(ValueError, match=r"\[0, 11\)"):  # -100 is now a (bad) token id
        CrossEntropyLoss(ignore_index=-1)({"labels": labels}, {"logits": logits})


def test_low_precision_logits_are_summed_in_float32():
    logits, labels = make_batch()
    out = CrossEntropyLoss()({"labels": labels}, {"logits": logits.to(torch.bfloat16)})
    assert out["loss"].dtype == torch.float32
    loss, _, _, _ = loop_reference(logits.to(torch.bfloat16).double(), labels)
    assert out["loss"].item() == pytest.approx(loss, rel=1e-5)


def test_no_label_tokens_is_a_clear_error_not_nan():
    logits, labels = make_batch()
    labels[:] = -100
    labels[:, 0] = 4  # position 0 cannot be predicted, so still nothing to learn
    with pytest.raises(ValueError, match="no label tokens"):
        CrossEntropyLoss()({"labels": labels}, {"logits": logits})


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        ({}, {"logits": torch.zeros(B, T, V)}, r"needs inputs\['labels'\]"),
        ({"labels": torch.zeros(B, T)}, {"logits": torch.zeros(B, T, V)}, "integer token ids"),
        ({"labels": torch.ones(B, T, dtype=torch.long)}, {"other": 1}, "got keys"),
        (
            {"labels": torch.ones(B, T, dtype=torch.long)},
            {"logits": torch.zeros(B, T)},
            "(B, T, V)",
        ),
        (
            {"labels": torch.ones(B, T, dtype=torch.long)},
            {"logps": torch.zeros(B, T + 1)},
            "aligned",
        ),
        ({"labels": torch.full((B, T), V)}, {"logits": torch.zeros(B, T, V)}, "vocabulary"),
        (
            {"labels": torch.zeros(0, 0, dtype=torch.long)},
            {"logits": torch.zeros(0, 0, V)},
            "empty",
        ),
    ],
)
def test_bad_inputs_say_what_is_wrong(inputs, outputs, message):
    with pytest.raises(ValueError, match=message):
        CrossEntropyLoss()(inputs, outputs)
