"""kernelize: on a CPU it replaces nothing and says so; on a fake platform whose "fast paths"
are the torch references it replaces the known layers by class, the model's logits and
gradients stay those of transformers' own code, and every replaced layer runs its op."""

import importlib
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

from twinkle.kernel import FastPath, kernelize, registry

OPS = ("rms_norm", "swiglu", "grouped_matmul", "rotary_embedding")
SMALL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
}


def build(config):
    torch.manual_seed(0)
    # transformers' own loop over experts is the baseline (its grouped_mm takes no float64).
    return AutoModelForCausalLM.from_config(config, experts_implementation="eager").double()


MODELS = {
    "qwen3": lambda: build(Qwen3Config(**SMALL)),
    "qwen3_moe": lambda: build(
        Qwen3MoeConfig(**SMALL, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2)
    ),
}


@pytest.fixture
def restore_rotary(monkeypatch):
    """kernelize wraps the modeling modules' apply_rotary_pos_emb: put them back afterwards."""
    for name in ("qwen3", "qwen3_moe"):
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        monkeypatch.setattr(module, "apply_rotary_pos_emb", module.apply_rotary_pos_emb)


@pytest.fixture
def fake_cpu_fast_paths(monkeypatch, restore_rotary):
    """A fast path for CPU tensors on every op kernelize uses: the reference, counted."""
    ran = Counter()

    def path(op):
        reference = registry._references[op]

        def run(*args, **kwargs):
            ran[op] += 1
            return reference(*args, **kwargs)

        return FastPath("fake", "torch", frozenset({"cpu"}), lambda: run)

    for op in OPS:
        monkeypatch.setitem(registry._fast_paths, op, [path(op)])
    monkeypatch.delenv("TWINKLE_KERNELS", raising=False)
    registry._load.cache_clear()
    yield ran
    registry._load.cache_clear()


def _logits_and_grads(model, input_ids):
    model.zero_grad()
    logits = model(input_ids=input_ids).logits
    logits.square().mean().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_on_cpu_nothing_is_replaced_and_the_report_says_so(name, restore_rotary):
    model = MODELS[name]()
    report = kernelize(model)
    assert report.device_type == "cpu" and report.replaced == []
    expected = {"rms_norm", "swiglu", "rotary_embedding"}
    if name == "qwen3_moe":
        expected = {"rms_norm", "grouped_matmul", "rotary_embedding"}
    assert set(report.kept) == expected
    assert "nothing replaced" in str(report) and "no fast path for rms_norm runs on cpu" in str(
        report
    )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_on_a_platform_with_fast_paths_the_layers_are_replaced_and_outputs_unchanged(
    name, fake_cpu_fast_paths
):
    model = MODELS[name]()
    input_ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(1))
    logits, grads = _logits_and_grads(model, input_ids)
    report = kernelize(model)
    layers = SMALL["num_hidden_layers"]
    counts = {op: n for (op, backend), n in report.counts().items() if backend == "fake"}
    # Per layer: input, post-attention, q and k norms; plus the final norm.
    expected = {"rms_norm": 4 * layers + 1, "rotary_embedding": 1}
    expected["grouped_matmul" if name == "qwen3_moe" else "swiglu"] = layers
    assert counts == expected and report.kept == {}
    assert "rms_norm -> fake: 9 layer(s)" in str(report)
    kernelized_logits, kernelized_grads = _logits_and_grads(model, input_ids)
    assert torch.allclose(kernelized_logits, logits, rtol=1e-12, atol=1e-12)
    for parameter, grad in grads.items():
        assert torch.allclose(kernelized_grads[parameter], grad, rtol=1e-10, atol=1e-12), parameter
    assert fake_cpu_fast_paths["rms_norm"] == 4 * layers + 1
    assert fake_cpu_fast_paths["rotary_embedding"] == layers
    if name == "qwen3_moe":  # two grouped matmuls per layer; their SwiGLU between them
        assert fake_cpu_fast_paths["grouped_matmul"] == 2 * layers
        assert fake_cpu_fast_paths["swiglu"] == layers
    else:
        assert fake_cpu_fast_paths["swiglu"] == layers
    assert kernelize(model).replaced == []  # once only


def test_twinkle_kernels_off_turns_replaced_layers_back_to_the_reference(
    fake_cpu_fast_paths, monkeypatch
):
    model = MODELS["qwen3"]()
    kernelize(model)
    monkeypatch.setenv("TWINKLE_KERNELS", "off")
    model(input_ids=torch.tensor([[1, 2, 3]]))
    assert sum(fake_cpu_fast_paths.values()) == 0
