"""InfonceLoss and the grouped embedding layout, against a float64 loop."""

import math

import pytest
import torch

from twinkle.loss import InfonceLoss, embedding_layout

# three groups: (anchor, positive, 2 hard negatives), (anchor, positive), (anchor, positive, 1)
LABELS = [1, 0, 0, 0, 1, 0, 1, 0, 0]


def make_embeddings(seed=0, rows=None, dim=6):
    rows = len(LABELS) if rows is None else rows
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, dim, generator=gen, dtype=torch.float64)


def cosine(x, y):
    dot = sum(a * b for a, b in zip(x, y, strict=True))
    return dot / (torch.sqrt(sum(a * a for a in x)) * torch.sqrt(sum(b * b for b in y)))


def infonce_loop(emb, labels, temperature, use_batch):
    starts = [i for i, flag in enumerate(labels) if flag == 1]
    ends = starts[1:] + [len(labels)]
    total = emb.new_zeros(())
    for start, end in zip(starts, ends, strict=True):
        anchor, positive = emb[start], emb[start + 1]
        if use_batch:
            candidates = [i for i, flag in enumerate(labels) if flag == 0]
        else:
            candidates = list(range(start + 1, end))
        denominator = sum(torch.exp(cosine(anchor, emb[c]) / temperature) for c in candidates)
        total = total - torch.log(torch.exp(cosine(anchor, positive) / temperature) / denominator)
    return total


@pytest.mark.parametrize(("temperature", "use_batch"), [(0.07, True), (0.5, True), (0.1, False)])
def test_infonce_matches_loop(temperature, use_batch):
    # without in-batch negatives each group needs its own
    labels = LABELS if use_batch else [1, 0, 0, 0, 1, 0, 0, 1, 0, 0]
    emb = make_embeddings(rows=len(labels))
    leaf = emb.clone().requires_grad_()
    out = InfonceLoss(temperature, use_batch)({"labels": labels}, {"embeddings": leaf})
    out["loss"].backward()
    ref_leaf = emb.clone().requires_grad_()
    expected = infonce_loop(ref_leaf, labels, temperature, use_batch)
    expected.backward()
    assert out["num_tokens"].item() == 3
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-10)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=1e-9, atol=1e-12)


def test_in_batch_negatives_count_in_the_denominator():
    """Orthogonal groups at temperature 0.1: each anchor scores 10 on its positive and 0
    on the two other groups' positives, so each term is log(1 + 2 exp(-10))."""
    basis = torch.eye(4, dtype=torch.float64)
    emb = torch.stack([basis[0], basis[0], basis[1], basis[1], basis[2], basis[2]])
    out = InfonceLoss(temperature=0.1)({"labels": [1, 0, 1, 0, 1, 0]}, {"embeddings": emb})
    assert out["loss"].item() == pytest.approx(3 * math.log1p(2 * math.exp(-10)), rel=1e-9, abs=0)


def test_layout_is_parsed_for_metrics_too():
    layout = embedding_layout(LABELS)
    assert layout.anchors.tolist() == [0, 4, 6]
    assert layout.positives.tolist() == [1, 5, 7]
    assert layout.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 2]
    assert layout.hard_negatives.tolist() == [2, 0, 1]


def test_hard_negatives_count_is_checked():
    labels = [1, 0, 0, 1, 0, 0]
    emb = make_embeddings(rows=6)
    assert InfonceLoss(hard_negatives=1)({"labels": labels}, {"embeddings": emb})["loss"] > 0
    with pytest.raises(ValueError, match=r"carry \[2, 0, 1\] hard negatives; give each group"):
        InfonceLoss(hard_negatives=1)({"labels": LABELS}, {"embeddings": make_embeddings()})


@pytest.mark.parametrize(
    ("loss", "labels", "rows", "message"),
    [
        (InfonceLoss(), [0, 1, 0], 3, "start with 1"),
        (InfonceLoss(), [1, 0, 1], 3, r"groups \[1\] have an anchor but no positive"),
        (InfonceLoss(), [1, 0, 2], 3, "1 .* or 0"),
        (InfonceLoss(), [1, 0, 0], 4, r"expected \(3, D\)"),
        (InfonceLoss(use_batch=False), [1, 0, 1, 0, 0], 5, r"groups \[0\] have no hard"),
        (InfonceLoss(), [[1, 0]], 2, r"one 0/1 flag per row"),
    ],
)
def test_bad_layouts_say_what_is_wrong(loss, labels, rows, message):
    with pytest.raises(ValueError, match=message):
        loss({"labels": labels}, {"embeddings": make_embeddings(rows=rows)})


def test_missing_fields_and_bad_hyperparameters():
    with pytest.raises(ValueError, match=r"needs outputs\['embeddings'\]"):
        InfonceLoss()({"labels": LABELS}, {})
    for kwargs in ({"temperature": 0}, {"hard_negatives": -1}):
        with pytest.raises(ValueError):
            InfonceLoss(**kwargs)
