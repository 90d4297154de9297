"""TransformersValueModel: values aligned with labels, LoRA with a trained head, checkpoints
that keep the head, micro-batches equal to one batch, and the bad inputs."""

import pytest
import torch
from peft import LoraConfig

from twinkle.model import TransformersValueModel

FEATURES = [
    {"input_ids": [5, 6, 7, 8, 9], "labels": [-100, -100, 7, 8, 9]},
    {"input_ids": [5, 10, 11], "labels": [-100, 10, 11]},
]
RETURNS = [[1.0, 0.5, -0.5], [2.0, -1.0]]  # one per label token


def test_values_are_the_head_at_the_previous_position():
    model = TransformersValueModel("bundled://tiny-qwen3")
    values = model.forward_only(FEATURES)["values"]
    assert values.shape == (2, 5)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    head = model.model(input_ids=ids).logits[0, :, 0]  # the HF model on its own
    torch.testing.assert_close(values[0, 1:], head[:-1].detach(), rtol=1e-5, atol=1e-6)
    assert values[:, 0].abs().sum() == 0


def test_lora_critic_learns_the_returns_with_a_trained_head(tmp_path):
    model = TransformersValueModel("bundled://tiny-qwen3")
    model.add_adapter_to_model("critic", LoraConfig(r=4, target_modules="all-linear"))
    model.set_loss("PPOValueLoss", epsilon=None)
    model.set_optimizer("AdamW", lr=2e-2)
    base = {
        n: p.detach().clone()
        for n, p in model.model.named_parameters()
        if "lora" not in n and "modules_to_save" not in n and "score" not in n
    }
    first = None
    for _ in range(20):
        out = model.forward_backward(FEATURES, returns=RETURNS)
        model.clip_grad_and_step()
        first = out.loss if first is None else first
        report = model.calculate_metric()  # this step's figures
    assert out.loss < first / 2, (first, out.loss)
    assert report["value/explained_variance"] > 0
    assert out["values"].shape == (2, 5)
    for name, param in model.model.named_parameters():
        if name in base:
            assert torch.equal(param, base[name]), name  # the backbone stays frozen
    saved = model.save("critic", output_dir=tmp_path)
    fresh = TransformersValueModel("bundled://tiny-qwen3")
    fresh.load(saved)
    torch.testing.assert_close(
        fresh.forward_only(FEATURES)["values"], model.forward_only(FEATURES)["values"]
    )


def test_full_checkpoint_is_a_model_id_with_its_head(tmp_path):
    model = TransformersValueModel("bundled://tiny-qwen3")
    model.set_loss("PPOValueLoss", epsilon=None)
    model.set_optimizer("AdamW", lr=1e-2)
    model.forward_backward(FEATURES, returns=RETURNS)
    model.clip_grad_and_step()
    saved = model.save("full", output_dir=tmp_path)
    again = TransformersValueModel(saved)
    torch.testing.assert_close(
        again.forward_only(FEATURES)["values"], model.forward_only(FEATURES)["values"]
    )


def test_micro_batches_step_like_one_batch():
    results = []
    for micro in (None, 1):
        model = TransformersValueModel("bundled://tiny-qwen3")
        model.set_optimizer("SGD", lr=0.1)
        old = model.forward_only(FEATURES)["values"]
        model.forward_backward(FEATURES, returns=RETURNS, old_values=old, micro_batch_size=micro)
        model.clip_grad_and_step(max_grad_norm=1e9)
        results.append(model.forward_only(FEATURES)["values"])
    torch.testing.assert_close(results[0], results[1], rtol=1e-5, atol=1e-6)


def test_bad_inputs_say_what_to_do():
    model = TransformersValueModel("bundled://tiny-qwen3")
    with pytest.raises(ValueError, match="needs returns"):
        model.forward_backward(FEATURES, old_values=[[0.0] * 3, [0.0] * 2])
    with pytest.raises(ValueError, match="needs old_values"):
        model.forward_backward(FEATURES, returns=RETURNS)
    with pytest.raises(ValueError, match=r"returns\[1\] has 1 values but row 1"):
        model.forward_backward(FEATURES, returns=[RETURNS[0], [1.0]], old_values=RETURNS)
    with pytest.raises(ValueError, match="task='embedding' is not offered"):
        model.forward_only(FEATURES, task="embedding", returns=RETURNS)
    model.set_loss("CrossEntropyLoss")
    with pytest.raises(ValueError, match=r"needs outputs\['logps'\]"):
        model.forward_backward(FEATURES)
    with pytest.raises(ValueError, match="builds its own model class"):
        TransformersValueModel("bundled://tiny-qwen3", model_cls=object)
    with pytest.raises(NotImplementedError, match="sequence parallel"):
        TransformersValueModel("bundled://tiny-qwen3", sequence_parallel=object())
