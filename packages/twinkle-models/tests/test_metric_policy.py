"""PolicyMetric from the policy_stats of GRPO/GSPO/CISPO, against per-token loops."""

import math

import pytest
import torch

from twinkle.loss import CISPOLoss, GRPOLoss, GSPOLoss
from twinkle.metric import PolicyMetric, build_train_metrics

B, T, V = 3, 6, 11


def batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, V, (B, T), generator=gen)
    labels[:, :2] = -100
    labels[1, 5] = -100
    logits = torch.randn(B, T, V, generator=gen, dtype=torch.float64)
    logps = logits.log_softmax(-1)
    token_logps = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(1, T):
            if labels[b, t] != -100:
                token_logps[b, t] = logps[b, t - 1, labels[b, t]]
    old = token_logps + 0.3 * torch.randn(B, T, generator=gen, dtype=torch.float64)
    advantages = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    return labels, logits, token_logps, old, advantages


def positions(labels):
    return [(b, t) for b in range(B) for t in range(1, T) if labels[b, t] != -100]


def test_grpo_stats_match_a_loop():
    labels, logits, logps, old, adv = batch()
    out = GRPOLoss(epsilon=0.2)({"labels": labels}, {"logps": logps}, old_logps=old, advantages=adv)
    metric = PolicyMetric()
    metric.accumulate({"labels": labels}, {"policy_stats": out["policy_stats"]})
    got = metric.calculate()
    ratios, clipped = [], 0
    for b, t in positions(labels):
        r = math.exp(logps[b, t] - old[b, t])
        ratios.append(r)
        clipped += (adv[b] > 0 and r > 1.2) or (adv[b] < 0 and r < 0.8)
    n = len(ratios)
    mean = sum(ratios) / n
    assert got["policy/clip_fraction"] == pytest.approx(clipped / n)
    assert 0 < clipped < n  # the batch exercises both cases
    assert got["policy/ratio_mean"] == pytest.approx(mean)
    assert got["policy/ratio_std"] == pytest.approx(
        math.sqrt(sum((r - mean) ** 2 for r in ratios) / n)
    )
    assert got["policy/ratio_min"] == pytest.approx(min(ratios))
    assert got["policy/ratio_max"] == pytest.approx(max(ratios))
    assert got["policy/kl_old"] == pytest.approx(sum(r - 1 - math.log(r) for r in ratios) / n)
    mismatch = sum(abs(logps[b, t] - old[b, t]) for b, t in positions(labels)) / n
    assert got["policy/logp_mismatch"] == pytest.approx(float(mismatch))
    assert "policy/kl_ref" not in got and "policy/entropy" not in got


def test_reference_kl_and_entropy_when_available():
    labels, logits, logps, old, adv = batch(1)
    ref = logps + 0.1
    loss = GRPOLoss(beta=0.1)
    out = loss({"labels": labels}, {"logits": logits}, old_logps=old, advantages=adv, ref_logps=ref)
    metric = PolicyMetric()
    metric.accumulate({"labels": labels}, {"logits": logits, "policy_stats": out["policy_stats"]})
    got = metric.calculate()
    n = len(positions(labels))
    k3 = math.exp(0.1) - 0.1 - 1
    assert got["policy/kl_ref"] == pytest.approx(k3, rel=1e-6)
    entropy = sum(
        float(-(logits[b, t - 1].softmax(-1) * logits[b, t - 1].log_softmax(-1)).sum())
        for b, t in positions(labels)
    )
    assert got["policy/entropy"] == pytest.approx(entropy / n)


def test_without_old_logps_there_is_no_mismatch_to_report_and_ratios_are_one():
    labels, _, logps, _, adv = batch()
    out = GRPOLoss()({"labels": labels}, {"logps": logps}, advantages=adv)
    metric = PolicyMetric()
    metric.accumulate({"labels": labels}, {"policy_stats": out["policy_stats"]})
    got = metric.calculate()
    assert "policy/logp_mismatch" not in got
    assert got["policy/ratio_mean"] == 1 and got["policy/clip_fraction"] == 0


def test_gspo_counts_clipped_sequences_and_cispo_capped_tokens():
    labels, _, logps, old, adv = batch()
    gspo = GSPOLoss(epsilon=0.01, epsilon_high=0.01)
    stats = gspo({"labels": labels}, {"logps": logps}, old_logps=old, advantages=adv)
    assert int(stats["policy_stats"]["clip_units"]) == B
    cispo = CISPOLoss(epsilon_high=0.1)
    stats = cispo({"labels": labels}, {"logps": logps}, old_logps=old, advantages=adv)
    capped = sum(math.exp(logps[b, t] - old[b, t]) > 1.1 for b, t in positions(labels))
    assert int(stats["policy_stats"]["clipped"]) == capped > 0


def test_two_batches_pool_their_tokens_and_reset_forgets():
    metric = PolicyMetric()
    for seed in (0, 1):
        labels, _, logps, old, adv = batch(seed)
        out = GRPOLoss()({"labels": labels}, {"logps": logps}, old_logps=old, advantages=adv)
        metric.accumulate({"labels": labels}, {"policy_stats": out["policy_stats"]})
    pooled = metric.calculate()["policy/ratio_mean"]
    ratios = []
    for seed in (0, 1):
        labels, _, logps, old, _ = batch(seed)
        ratios += [math.exp(logps[b, t] - old[b, t]) for b, t in positions(labels)]
    assert pooled == pytest.approx(sum(ratios) / len(ratios))
    metric.reset()
    assert metric.calculate() == {}


def test_supervised_batches_are_ignored_and_the_default_metrics_include_it():
    metric = PolicyMetric()
    metric.accumulate({"labels": torch.zeros(1, 2)}, {"logits": torch.zeros(1, 2, 3)}, loss=1.0)
    metric.accumulate(None, None, grad_norm=1.0)
    assert metric.calculate() == {}
    assert any(isinstance(m, PolicyMetric) for m in build_train_metrics().values())


def test_reduce_across_sums_the_ranks():
    labels, _, logps, old, adv = batch()
    out = GRPOLoss()({"labels": labels}, {"logps": logps}, old_logps=old, advantages=adv)
    metric = PolicyMetric()
    metric.accumulate({"labels": labels}, {"policy_stats": out["policy_stats"]})
    alone = metric.calculate()
    metric.reduce_across(lambda t: t * 2)  # two identical ranks
    assert metric.calculate() == pytest.approx(alone)
