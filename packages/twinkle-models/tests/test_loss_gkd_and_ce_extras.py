"""GKDLoss against a float64 loop over the vocabulary written from the GKD paper's
definition; CrossEntropyLoss's reduction, DFT weighting and flat labels by hand."""

import math

import pytest
import torch

from twinkle.loss import CrossEntropyLoss, GKDLoss

V = 5


def distill_batch():
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, V, (2, 5), generator=gen)
    labels[:, :2] = -100
    labels[1, 4] = -100
    student = torch.randn(2, 5, V, generator=gen, dtype=torch.float64)
    teacher = torch.randn(2, 5, V, generator=gen, dtype=torch.float64) * 2
    return labels, student, teacher


def softmax(row, temperature):
    exps = [math.exp(x / temperature) for x in row]
    return [e / sum(exps) for e in exps]


def jsd_loop(labels, student, teacher, beta, temperature):
    total, count = 0.0, 0
    for b in range(labels.shape[0]):
        for t in range(1, labels.shape[1]):
            if labels[b, t] == -100:
                continue
            s = softmax(student[b, t - 1].tolist(), temperature)
            q = softmax(teacher[b, t - 1].tolist(), temperature)
            if beta == 0:
                term = sum(qi * math.log(qi / si) for qi, si in zip(q, s, strict=True))
            elif beta == 1:
                term = sum(si * math.log(si / qi) for qi, si in zip(q, s, strict=True))
            else:
                m = [beta * qi + (1 - beta) * si for qi, si in zip(q, s, strict=True)]
                term = beta * sum(qi * math.log(qi / mi) for qi, mi in zip(q, m, strict=True))
                term += (1 - beta) * sum(
                    si * math.log(si / mi) for si, mi in zip(s, m, strict=True)
                )
            total += term
            count += 1
    return total, count


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_gkd_matches_the_vocabulary_loop(beta, temperature):
    labels, student, teacher = distill_batch()
    out = GKDLoss(beta=beta, temperature=temperature)(
        {"labels": labels}, {"logits": student}, teacher_logits=teacher
    )
    expected, count = jsd_loop(labels, student, teacher, beta, temperature)
    assert out["num_tokens"].item() == count == 5
    assert out["loss"].item() == pytest.approx(expected, rel=1e-10)


def test_gkd_gradient_vanishes_at_the_teacher_and_matches_finite_differences():
    labels, student, teacher = distill_batch()
    same = GKDLoss(beta=0.5)(
        {"labels": labels}, {"logits": teacher.clone().requires_grad_()}, teacher_logits=teacher
    )
    assert same["loss"].item() == pytest.approx(0.0, abs=1e-12)
    leaf = student.clone().requires_grad_()
    GKDLoss(beta=0.3)({"labels": labels}, {"logits": leaf}, teacher_logits=teacher)[
        "loss"
    ].backward()
    b, t, v, h = 0, 2, 3, 1e-6
    bumped = [student.clone(), student.clone()]
    bumped[0][b, t, v] += h
    bumped[1][b, t, v] -= h
    plus, minus = (jsd_loop(labels, x, teacher, 0.3, 1.0)[0] for x in bumped)
    assert leaf.grad[b, t, v].item() == pytest.approx((plus - minus) / (2 * h), rel=1e-6)


def test_gkd_bad_inputs():
    labels, student, teacher = distill_batch()
    with pytest.raises(ValueError, match=r"GKDLoss needs teacher_logits: pass teacher_logits"):
        GKDLoss()({"labels": labels}, {"logits": student})
    with pytest.raises(ValueError, match="vocabulary has 4 entries and the student's 5"):
        GKDLoss()({"labels": labels}, {"logits": student}, teacher_logits=teacher[..., :4])
    with pytest.raises(ValueError, match=r"needs outputs\['logits'\]"):
        GKDLoss()({"labels": labels}, {"logps": student[..., 0]}, teacher_logits=teacher)
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        GKDLoss(beta=1.5)
    with pytest.raises(ValueError, match="temperature"):
        GKDLoss(temperature=0)


def ce_batch():
    gen = torch.Generator().manual_seed(2)
    labels = torch.randint(0, V, (2, 6), generator=gen)
    labels[:, :2] = -100
    labels[0, 5] = -100
    logits = torch.randn(2, 6, V, generator=gen, dtype=torch.float64)
    return labels, logits


def token_terms(labels, logits):
    out = []
    for b in range(labels.shape[0]):
        for t in range(1, labels.shape[1]):
            if labels[b, t] != -100:
                p = softmax(logits[b, t - 1].tolist(), 1.0)[int(labels[b, t])]
                out.append(p)
    return out


def test_reductions_and_dft():
    labels, logits = ce_batch()
    probs = token_terms(labels, logits)
    nll = -sum(math.log(p) for p in probs)
    token = CrossEntropyLoss()({"labels": labels}, {"logits": logits})
    assert (token["loss"].item(), token["num_tokens"].item()) == (pytest.approx(nll), len(probs))
    mean = CrossEntropyLoss(reduction="mean")({"labels": labels}, {"logits": logits})
    assert (mean["loss"].item(), mean["num_tokens"].item()) == (pytest.approx(nll / 7), 1)
    total = CrossEntropyLoss(reduction="sum")({"labels": labels}, {"logits": logits})
    assert (total["loss"].item(), total["num_tokens"].item()) == (pytest.approx(nll), 1)
    leaf = logits.clone().requires_grad_()
    dft = CrossEntropyLoss(dft=True)({"labels": labels}, {"logits": leaf})
    assert dft["loss"].item() == pytest.approx(-sum(p * math.log(p) for p in probs))
    dft["loss"].backward()
    # d/dz of -p.detach() * log p at the label logit is -p * (1 - p).
    b, t = 0, 2
    p = softmax(logits[b, t - 1].tolist(), 1.0)[int(labels[b, t])]
    assert leaf.grad[b, t - 1, int(labels[b, t])].item() == pytest.approx(-p * (1 - p))
    with pytest.raises(ValueError, match="reduction must be one of"):
        CrossEntropyLoss(reduction="avg")


def test_flat_packed_labels_equal_one_row():
    labels, logits = ce_batch()
    row = CrossEntropyLoss()({"labels": labels[:1]}, {"logits": logits[:1]})
    flat = CrossEntropyLoss()({"labels": labels[0]}, {"logits": logits[0]})
    assert flat["loss"].item() == pytest.approx(row["loss"].item(), rel=1e-12)
    assert flat["logps"].shape == labels[0].shape
    torch.testing.assert_close(flat["predicted_ids"], row["predicted_ids"][0])
    with pytest.raises(ValueError, match=r"flat labels \(6,\) need outputs\['logits'\] with 6"):
        CrossEntropyLoss()({"labels": labels[0]}, {"logits": logits[0, :5]})
