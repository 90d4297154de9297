"""The MoE router load-balancing loss in TransformersModel training, on one process.

With ``output_router_logits=True`` the first step's gradients equal those of a plain
Hugging Face forward with labels, whose ``outputs.loss`` is the mean cross-entropy plus
``router_aux_loss_coef * aux_loss`` (tolerance 1e-5, float32). The SP(2) run of the same
loss is a case of test_sequence_parallel.
"""

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import twinkle.model.transformers.model as model_module
from twinkle.metric import ScalarMetric
from twinkle.model import TransformersModel
from twinkle.processor import InputProcessor


def moe_config(output_router_logits: bool = True):
    return AutoConfig.for_model(
        "qwen3_moe",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=512,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        pad_token_id=0,
        output_router_logits=output_router_logits,
        router_aux_loss_coef=0.5,  # large, so a missing aux term shows in the gradients
    )


def features() -> list[dict]:
    generator = torch.Generator().manual_seed(3)
    rows = []
    for length in (9, 5, 7):
        ids = torch.randint(1, 512, (length,), generator=generator)
        labels = ids.clone()
        labels[:2] = -100
        rows.append({"input_ids": ids.tolist(), "labels": labels.tolist()})
    return rows


def first_step_grads(config) -> tuple[TransformersModel, dict[str, torch.Tensor]]:
    model = TransformersModel(config=copy.deepcopy(config), device="cpu", seed=0)
    model.set_processor(InputProcessor)
    model.set_optimizer("SGD", lr=0.0)
    model.forward_backward(features())
    grads = {n: p.grad.clone() for n, p in model.model.named_parameters() if p.grad is not None}
    return model, grads


def hf_grads(model: TransformersModel, config) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A fresh copy of the same initial weights, HF's own loss (labels passed)."""
    reference = AutoModelForCausalLM.from_config(copy.deepcopy(config)).float()
    reference.load_state_dict(model.model.state_dict())
    batch = InputProcessor()(features())
    out = reference(**batch, use_cache=False)
    out.loss.backward()
    return out.aux_loss, {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunked", [False, True], ids=["logits", "chunked_head"])
def test_first_step_gradients_equal_hf_loss_with_the_aux_term(monkeypatch, chunked):
    # The chunked path runs the decoder alone and the head chunk by chunk.
    monkeypatch.setattr(model_module, "prefers_chunked", lambda *args: chunked)
    config = moe_config()
    model, grads = first_step_grads(config)
    # Before any step, the weights are the initial ones: gradients are divided at the step.
    tokens = sum(sum(1 for t in f["labels"][1:] if t != -100) for f in features())
    aux, expected = hf_grads(model, config)
    assert float(aux.detach()) > 0
    assert set(grads) == set(expected)
    diffs = {n: float((g / tokens - expected[n]).abs().max()) for n, g in grads.items()}
    assert max(diffs.values()) < 1e-5, sorted(diffs.items(), key=lambda kv: -kv[1])[:3]
    # The router weights get the aux gradient: without it they would differ from HF's.
    _, without = first_step_grads(moe_config(output_router_logits=False))
    router = next(n for n in grads if n.endswith("mlp.gate.weight"))
    assert float((without[router] / tokens - expected[router]).abs().max()) > 1e-4


def test_reported_loss_includes_the_aux_term_and_aux_is_a_metric():
    config = moe_config()
    model = TransformersModel(config=copy.deepcopy(config), device="cpu", seed=0)
    model.set_processor(InputProcessor)
    model.add_metric(ScalarMetric("aux_loss"))
    out = model.forward_backward(features())
    reference = AutoModelForCausalLM.from_config(copy.deepcopy(config)).float()
    reference.load_state_dict(model.model.state_dict())
    with torch.no_grad():
        hf = reference(**InputProcessor()(features()), use_cache=False)
    assert out.loss == pytest.approx(float(hf.loss), rel=1e-5)
    assert model.calculate_metric(is_training=True)["aux_loss"] == pytest.approx(
        float(hf.aux_loss), rel=1e-5
    )
