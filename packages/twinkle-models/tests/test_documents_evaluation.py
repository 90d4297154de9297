"""Evaluation as the Qwen3.5 best-practice page writes it: ``forward_only(inputs=batch)``,
``calculate_loss()``, ``calculate_metric(is_training=False)``. It reports the evaluation
loss and leaves the training untouched: no gradient, no token count, no training metric."""

import pytest
import torch
from peft import LoraConfig
from tqdm import tqdm

from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.utils.testing import reduction_tolerance

MODEL_ID = "bundled://tiny-qwen3"
DATASET_ID = "bundled://self-cognition"


def eval(model):  # noqa: A001 - the page's function, as written; ids changed only
    # 验证集：100 条样本
    dataset = Dataset(dataset_meta=DatasetMeta(DATASET_ID, data_slice=range(100)))
    dataset.set_template("Qwen3_5Template", model_id=MODEL_ID)
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    dataloader = DataLoader(dataset=dataset, batch_size=8)
    for step, batch in tqdm(enumerate(dataloader)):  # noqa: B007 - as the page writes it
        model.forward_only(inputs=batch)
        model.calculate_loss()
        metrics = model.calculate_metric(is_training=False)
    return metrics


@pytest.fixture(scope="module")
def batches():
    dataset = Dataset(dataset_meta=DatasetMeta(DATASET_ID, data_slice=range(16)))
    dataset.set_template("Qwen3_5Template", model_id=MODEL_ID)
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    return list(DataLoader(dataset=dataset, batch_size=8))


def lora_model() -> TransformersModel:
    model = TransformersModel(model_id=MODEL_ID)
    model.add_adapter_to_model(
        "default", LoraConfig(r=8, lora_alpha=32, target_modules="all-linear")
    )
    model.set_optimizer(optimizer_cls="AdamW", lr=1e-4)
    return model


def gradients(model: TransformersModel) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.model.named_parameters() if p.grad is not None}


def test_the_pages_eval_loop_reports_the_loss_and_leaves_training_alone(batches):
    model = lora_model()
    model.forward_backward(inputs=batches[0])  # a training window left open, as mid-epoch
    state = model._state(None)
    grads, tokens = gradients(model), state.pending_tokens
    assert grads and tokens > 0

    metrics = eval(model)

    assert 0 < float(metrics["loss"]) < 20 and metrics["tokens"] > 0
    after = gradients(model)
    assert after.keys() == grads.keys()
    for name, grad in grads.items():
        assert torch.equal(after[name], grad), name
    assert state.pending_tokens == tokens
    # The training metrics hold the one training batch alone: those of a model that did not
    # evaluate (LoRA starts as the identity, so both computed the same loss).
    untouched = lora_model()
    untouched.forward_backward(inputs=batches[0])
    expected = untouched.calculate_metric(is_training=True)
    assert model.calculate_metric(is_training=True) == pytest.approx(expected)


def test_calculate_loss_after_forward_only_is_the_evaluated_loss(batches):
    model = lora_model()
    batch = batches[1]
    output = model.forward_only(inputs=batch)
    loss = model.calculate_loss()
    metrics = model.calculate_metric(is_training=False)
    label_tokens = sum(int((torch.as_tensor(f["labels"]) != -100).sum()) for f in batch)
    tol = reduction_tolerance(torch.tensor(output.loss), terms=label_tokens, dtype=torch.float32)
    assert loss == pytest.approx(output.loss, rel=tol["rtol"])
    assert metrics["loss"] == pytest.approx(output.loss, rel=tol["rtol"])
    assert all(p.grad is None for p in model.model.parameters())
    with pytest.raises(ValueError, match=r"backward after forward_only.*call forward\(inputs\)"):
        model.backward()
    model.forward_backward(inputs=batch)  # a training forward: no evaluated loss is left over
    with pytest.raises(ValueError, match=r"calculate_loss needs outputs"):
        model.calculate_loss()


def test_calculate_loss_without_a_forward_says_which_calls_come_first():
    model = lora_model()
    with pytest.raises(ValueError, match=r"call forward\(inputs\) \(or forward_only"):
        model.calculate_loss()
