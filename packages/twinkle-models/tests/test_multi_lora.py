"""MultiLoraTransformersModel: a bounded pool of LoRA slots; adapters train in isolation."""

import pytest
import torch
from peft import LoraConfig

from twinkle.model.transformers.multi_lora import LoraPoolFullError, MultiLoraTransformersModel

BATCH = [{"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}]


@pytest.fixture(scope="module")
def model():
    return MultiLoraTransformersModel("bundled://tiny-qwen3", max_loras=2, max_rank=8, device="cpu")


def _lora(rank: int = 4, **kw) -> LoraConfig:
    return LoraConfig(r=rank, target_modules="all-linear", lora_dropout=0.0, **kw)


def _adapter_weights(model, name):
    return {k: v.detach().clone() for k, v in model.model.named_parameters() if f".{name}." in k}


def test_pool_limits_rank_count_and_modules_to_save(model):
    with pytest.raises(ValueError, match="max_rank 8"):
        model.add_adapter_to_model("big", _lora(16))
    with pytest.raises(ValueError, match="modules_to_save"):
        model.add_adapter_to_model("mts", _lora(modules_to_save=["lm_head"]))
    model.add_adapter_to_model("a", _lora())
    model.add_adapter_to_model("b", _lora())
    assert model.capacity() == {"max_loras": 2, "used_loras": 2, "free_loras": 0}
    with pytest.raises(LoraPoolFullError):
        model.add_adapter_to_model("c", _lora())


def test_training_one_adapter_leaves_the_other_bit_identical(model):
    for name in ("a", "b"):
        model.set_optimizer("AdamW", lr=1e-2, adapter_name=name)
    b_before = _adapter_weights(model, "b")
    a_before = _adapter_weights(model, "a")
    model.forward_backward(BATCH, adapter_name="a")
    model.step(adapter_name="a")
    model.zero_grad(adapter_name="a")
    assert any(not torch.equal(a_before[k], v) for k, v in _adapter_weights(model, "a").items())
    for key, value in _adapter_weights(model, "b").items():
        assert torch.equal(b_before[key], value), key


def test_remove_frees_the_slot_and_forgets_the_adapter(model):
    model.remove_adapter("a")
    assert model.capacity()["free_loras"] == 1 and model.adapter_names == ["b"]
    assert _adapter_weights(model, "a") == {}
    with pytest.raises(ValueError, match="unknown adapter"):
        model.step(adapter_name="a")
    model.add_adapter_to_model("c", _lora())
    assert model.capacity()["used_loras"] == 2
