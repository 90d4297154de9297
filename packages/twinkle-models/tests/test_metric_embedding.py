"""EmbeddingMetric: pos_sim / neg_sim against pair-by-pair cosine computed by hand."""

import math

import numpy as np
import pytest
import torch

from twinkle.metric import EmbeddingMetric


def cosine(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# group 0: anchor 0, positive 1, hard negative 2; group 1: anchor 3, positive 4.
EMBEDDINGS = [[1.0, 0.0, 0.0], [2.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 3.0], [1.0, 0.0, 1.0]]
LABELS = [1, 0, 0, 1, 0]


def accumulate(metric, embeddings=EMBEDDINGS, labels=LABELS):
    metric.accumulate({"labels": torch.tensor(labels)}, {"embeddings": torch.tensor(embeddings)})


def test_in_batch_negatives():
    metric = EmbeddingMetric()
    accumulate(metric)
    e = EMBEDDINGS
    positives = [cosine(e[0], e[1]), cosine(e[3], e[4])]
    # anchor 0: its hard negative 2 and the other group's positive 4;
    # anchor 3: the other group's positive 1 and hard negative 2. Anchors are never negatives.
    negatives = [cosine(e[0], e[2]), cosine(e[0], e[4]), cosine(e[3], e[1]), cosine(e[3], e[2])]
    assert metric.calculate() == {
        "pos_sim": pytest.approx(np.mean(positives), abs=1e-6),
        "neg_sim": pytest.approx(np.mean(negatives), abs=1e-6),
    }


def test_hard_negatives_only_without_use_batch():
    metric = EmbeddingMetric(use_batch=False)
    accumulate(metric)
    result = metric.calculate()
    assert result["neg_sim"] == pytest.approx(cosine(EMBEDDINGS[0], EMBEDDINGS[2]), abs=1e-6)


def test_means_run_over_all_pairs_since_reset():
    metric = EmbeddingMetric()
    accumulate(metric)
    accumulate(metric, [[1.0, 0.0], [0.0, 1.0]], [1, 0])  # one pair, cos 0, no negatives
    e = EMBEDDINGS
    positives = [cosine(e[0], e[1]), cosine(e[3], e[4]), 0.0]
    assert metric.calculate()["pos_sim"] == pytest.approx(np.mean(positives), abs=1e-6)
    metric.reset()
    assert metric.calculate() == {}


def test_a_single_pair_reports_no_neg_sim():
    metric = EmbeddingMetric()
    accumulate(metric, [[1.0, 1.0], [1.0, 0.0]], [1, 0])
    assert metric.calculate() == {"pos_sim": pytest.approx(math.sqrt(0.5), abs=1e-6)}


def test_step_level_calls_are_ignored():
    metric = EmbeddingMetric()
    metric.accumulate(None, None, grad_norm=1.0)
    assert metric.calculate() == {}


def test_matches_the_loss_layout_on_the_documented_pairs():
    # The document's layout: [anchor_0, positive_0, anchor_1, positive_1], labels [1, 0, 1, 0].
    e = [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [-1.0, 1.0]]
    metric = EmbeddingMetric()
    accumulate(metric, e, [1, 0, 1, 0])
    assert metric.calculate() == {
        "pos_sim": pytest.approx((cosine(e[0], e[1]) + cosine(e[2], e[3])) / 2, abs=1e-6),
        "neg_sim": pytest.approx((cosine(e[0], e[3]) + cosine(e[2], e[1])) / 2, abs=1e-6),
    }


def test_calls_without_embeddings_are_ignored():
    metric = EmbeddingMetric()
    metric.accumulate({"labels": torch.tensor([[-100, 1]])}, {"logits": torch.zeros(1, 2, 3)})
    assert metric.calculate() == {}


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        ([0, 1, 0, 1, 0], "first row is an anchor"),
        ([1, 0, 2, 1, 0], "must be 1 \\(a group's anchor\\) or 0"),
        ([1, 0, 0, 0, 1], "groups \\[1\\] have an anchor but no positive"),
        ([1, 1, 0, 1, 0], "groups \\[0\\] have an anchor but no positive"),
        ([1, 0, 1, 0], "labels mark 4 rows; expected \\(4, hidden\\)"),
    ],
)
def test_bad_layouts(labels, match):
    with pytest.raises(ValueError, match=match):
        accumulate(EmbeddingMetric(), labels=labels)


def test_bad_inputs():
    metric = EmbeddingMetric()
    with pytest.raises(ValueError, match="has shape \\(1, 2, 3\\)"):
        metric.accumulate({"labels": torch.tensor([1, 0])}, {"embeddings": torch.zeros(1, 2, 3)})
    with pytest.raises(KeyError, match="needs inputs\\['labels'\\]"):
        metric.accumulate(None, {"embeddings": torch.zeros(2, 3)})
    with pytest.raises(TypeError, match="must be a tensor"):
        metric.accumulate({"labels": torch.tensor([1, 0])}, {"embeddings": [[1.0], [2.0]]})
    assert metric.calculate() == {}
