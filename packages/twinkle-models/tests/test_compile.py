"""TransformersModel(compile=...): compiled decoder layers train like eager ones (the same
losses and weights over steps of different lengths, packed and padded, with LoRA), and
compilation that cannot be used falls back to eager with one warning naming the cause.

The equality test compiles with the ``aot_eager`` backend (dynamo's capture and AOT
autograd, as every backend runs them; seconds on a CPU); inductor's code generation, which
takes minutes on the 2-core CI machine, is checked by ``benchmarks/bench_model_packing.py``
(``--compile``), whose compiled side must reproduce the eager loss.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from peft import LoraConfig

from twinkle.model import TransformersModel
from twinkle.model.transformers.compile import CompiledLayers
from twinkle.processor import InputProcessor

MODEL_ID = "bundled://tiny-qwen3"


def rows(lengths: tuple[int, ...]) -> list[dict]:
    generator = torch.Generator().manual_seed(sum(lengths))
    out = []
    for n in lengths:
        ids = torch.randint(1, 3000, (n,), generator=generator).tolist()
        out.append({"input_ids": ids, "labels": ids})
    return out


BATCHES = [rows((3, 17, 5, 2, 11)), rows((9, 9, 9))]  # packed by default; uniform: padded


def train(compile, padding_free: bool | None = None) -> tuple[list[float], dict, TransformersModel]:
    model = TransformersModel(MODEL_ID, compile=compile)
    torch.manual_seed(0)
    model.add_adapter_to_model("default", LoraConfig(r=4, target_modules="all-linear"))
    model.set_processor(InputProcessor, padding_free=padding_free)
    model.set_optimizer("AdamW", lr=1e-3)
    losses = []
    for batch in BATCHES:
        losses.append(model.forward_backward(inputs=batch).loss)
        model.clip_grad_and_step()
    params = {n: p.detach().clone() for n, p in model.model.named_parameters() if p.requires_grad}
    return losses, params, model


def test_compiled_layers_train_like_eager_ones():
    eager_losses, eager_params, _ = train(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback
        losses, params, model = train({"backend": "aot_eager"})
    assert model._compiled.active and len(model._compiled.layers) == 2
    torch.testing.assert_close(losses, eager_losses, atol=0.0, rtol=1e-6)
    for name, value in eager_params.items():
        torch.testing.assert_close(params[name], value, atol=1e-6, rtol=1e-6, msg=name)


def failing_backend(graph, example_inputs):
    raise RuntimeError("this backend cannot compile anything")


def test_a_failing_compilation_runs_eagerly_after_one_warning():
    eager_losses, _, _ = train(False, padding_free=False)
    with pytest.warns(RuntimeWarning) as caught:
        losses, _, model = train({"backend": failing_backend}, padding_free=False)
    messages = [str(w.message) for w in caught if "compile=True" in str(w.message)]
    assert len(messages) == 1
    assert "running the model eagerly" in messages[0]
    assert "this backend cannot compile anything" in messages[0]
    assert not model._compiled.active
    torch.testing.assert_close(losses, eager_losses, atol=0.0, rtol=1e-6)


def test_strategies_that_run_collectives_in_the_layers_run_eager():
    model = TransformersModel(MODEL_ID)
    layers = CompiledLayers(model._hf_model(), {"backend": "aot_eager"}, lambda: "fsdp")
    with pytest.warns(RuntimeWarning, match=r"the fsdp strategy .* one process and under DDP"):
        model.forward_backward(inputs=BATCHES[0])
    assert not layers.active and all(m._compiled_call_impl is None for m in layers.layers)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_compile_takes_a_bool_or_torch_compile_options(value):
    with pytest.raises(TypeError, match="compile must be True, False or a dict"):
        TransformersModel(MODEL_ID, compile=value)
