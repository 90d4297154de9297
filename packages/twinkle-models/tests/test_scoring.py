"""reference_logps (the LoRA model with its adapter disabled, no second copy) and
token_logits (a teacher's distributions), against a separately built base model."""

import pytest
import torch
from peft import LoraConfig

from twinkle.loss import GKDLoss, GRPOLoss
from twinkle.model import TransformersModel

FEATURES = [
    {"input_ids": [5, 6, 7, 8, 9], "labels": [-100, -100, 7, 8, 9]},
    {"input_ids": [5, 10, 11], "labels": [-100, 10, 11]},
]


def trained_lora_model():
    model = TransformersModel("bundled://tiny-qwen3")
    model.add_adapter_to_model(
        "policy", LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    )
    return model


def test_reference_logps_are_the_base_models_and_leave_the_adapter_on():
    model = trained_lora_model()
    base = TransformersModel("bundled://tiny-qwen3")  # same seed: the same base weights
    reference = model.reference_logps(FEATURES)
    torch.testing.assert_close(reference, base.forward_only(FEATURES).logps, rtol=1e-5, atol=1e-5)
    policy = model.forward_only(FEATURES).logps
    assert (policy - reference).abs().max() > 1e-3  # the adapter is active again afterwards
    out = GRPOLoss(beta=0.1)(
        {"labels": torch.tensor([[-100, -100, 7, 8, 9], [-100, 10, 11, -100, -100]])},
        {"logps": policy},
        advantages=[1.0, -1.0],
        ref_logps=reference,
    )
    assert out["policy_stats"]["ref_kl_sum"] > 0


def test_policy_logps_are_forward_only_s_without_the_loss_or_its_metrics():
    model = TransformersModel("bundled://tiny-qwen3")
    expected = model.forward_only(FEATURES).logps  # the default loss needs nothing more
    model.set_loss("DecoupledPPOLoss")  # forward_only would now need advantages and old_logps
    model.calculate_metric(is_training=False)  # and reset the evaluation metrics
    torch.testing.assert_close(model.policy_logps(FEATURES), expected, rtol=0, atol=0)
    assert model.calculate_metric(is_training=False) == {}
    with pytest.raises(ValueError, match="policy_logps scores label tokens"):
        model.policy_logps([{"input_ids": [5, 6, 7]}])


def test_reference_logps_refuse_a_full_model_and_unlabelled_batches():
    with pytest.raises(ValueError, match="has none .* second TransformersModel"):
        TransformersModel("bundled://tiny-qwen3").reference_logps(FEATURES)
    with pytest.raises(ValueError, match="give the batch labels"):
        trained_lora_model().reference_logps([{"input_ids": [5, 6, 7]}])


def test_token_logits_feed_gkd():
    teacher = TransformersModel("bundled://tiny-qwen3", seed=1)
    logits = teacher.token_logits(FEATURES)
    assert logits.shape == (2, 5, 3909) and logits.dtype == torch.float32
    # Its label-token log-softmax is the teacher's own logps.
    labels = torch.tensor([[-100, -100, 7, 8, 9], [-100, 10, 11, -100, -100]])
    picked = logits[0, 1:4].log_softmax(-1).gather(1, labels[0, 2:5, None])[:, 0]
    torch.testing.assert_close(
        picked, teacher.forward_only(FEATURES).logps[0, 2:5], rtol=1e-5, atol=1e-5
    )
    student = TransformersModel("bundled://tiny-qwen3")
    student.set_loss(GKDLoss(beta=0.5))
    out = student.forward_backward(FEATURES, teacher_logits=logits)
    assert out.loss > 0 and out.num_tokens == 5
    assert student.calculate_metric()["distill/reverse_kl"] > 0


def test_scoring_passes_refuse_a_pipelined_model_with_the_reason(monkeypatch):
    """Under pp each rank holds only its stages: the three scoring passes refuse (the
    pipelined plan is stood in for; the pp runs themselves are test_pipeline_parallel's)."""
    from types import SimpleNamespace

    model = TransformersModel("bundled://tiny-qwen3")
    monkeypatch.setattr(model, "_parallel", lambda: SimpleNamespace(pipeline=object()))
    for method in ("policy_logps", "reference_logps", "token_logits"):
        with pytest.raises(ValueError, match=f"{method} does not run under pipeline parallel"):
            getattr(model, method)(FEATURES)
