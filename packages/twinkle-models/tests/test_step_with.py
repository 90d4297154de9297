"""``step_with``: one optimizer step with the caller's hyperparameters, optionally on the
gradient of the summed loss (the Tinker API's optim_step), plus the pool model's facts
the server asks for (vocabulary size, model folder) and seeded adapters.

Tolerances, float32 on CPU: weight moves to 1e-6 absolute (an SGD step is one multiply-add
per weight, so only rounding differs); the DDP run against one process to 1e-6 absolute as
well (the two ranks' gradients are summed in another order).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from peft import LoraConfig

from twinkle.model.components import set_param_groups
from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel
from twinkle.module.optimizer import build_optimizer

ROW = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}
LR = 0.5
SCRIPT = Path(__file__).parent / "scripts" / "step_with_ddp.py"


@pytest.fixture(scope="module")
def model():
    return MultiLoraTransformersModel("bundled://tiny-qwen3", max_loras=9, max_rank=8, device="cpu")


def _lora() -> LoraConfig:
    return LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0)


def _trainable(model, name: str) -> dict[str, torch.nn.Parameter]:
    return {k: p for k, p in model.model.named_parameters() if f".{name}." in k}


def _sgd_step(model, name: str, **step_kwargs) -> tuple[dict, dict, float, object]:
    """One forward_backward then step_with on a fresh SGD adapter: the gradients before the
    step, the weight moves, the label token count and step_with's return value."""
    model.add_adapter_to_model(name, _lora())
    model.set_optimizer("SGD", lr=1e-3, adapter_name=name)
    params = _trainable(model, name)
    before = {k: p.detach().clone() for k, p in params.items()}
    tokens = model.forward_backward([ROW], adapter_name=name).num_tokens
    grads = {k: p.grad.clone() for k, p in params.items() if p.grad is not None}
    returned = model.step_with(adapter_name=name, optimizer_params={"lr": LR}, **step_kwargs)
    moves = {k: p.detach() - before[k] for k, p in params.items()}
    assert all(p.grad is None for p in params.values())  # zeroed for the next window
    return grads, moves, tokens, returned


def _assert_moves(moves: dict, grads: dict, weights: dict, scale: float) -> None:
    """A move is (w - scale*g) - w in float32: its rounding is that of the weights, not of g."""
    assert grads and any(float(g.abs().max()) > 0 for g in grads.values())
    for key, grad in grads.items():
        atol = 4 * torch.finfo(torch.float32).eps * float(weights[key].detach().abs().max())
        torch.testing.assert_close(moves[key], -scale * grad, atol=atol, rtol=0)


def test_normalise_false_applies_the_gradient_of_the_summed_loss(model):
    grads, moves, tokens, returned = _sgd_step(model, "summed", normalise=False)
    assert tokens == 4 and returned is None
    _assert_moves(moves, grads, _trainable(model, "summed"), LR)


def test_normalise_true_divides_by_the_token_count(model):
    grads, moves, tokens, _ = _sgd_step(model, "mean")
    _assert_moves(moves, grads, _trainable(model, "mean"), LR / tokens)


def test_max_grad_norm_clips_and_returns_the_norm(model):
    grads, moves, _, norm = _sgd_step(model, "clipped", normalise=False, max_grad_norm=1e-3)
    expected = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values()))
    assert norm == pytest.approx(float(expected), rel=1e-5)
    moved = torch.sqrt(sum((m.double() ** 2).sum() for m in moves.values()))
    assert float(moved) == pytest.approx(LR * 1e-3, rel=1e-4)  # the clipped step's length
    assert model.calculate_metric(adapter_name="clipped")["grad_norm"] == pytest.approx(norm)


def test_optimizer_params_are_written_and_unknown_ones_refused(model):
    model.add_adapter_to_model("adam", _lora())
    model.set_optimizer("AdamW", lr=1e-3, adapter_name="adam")
    params = _trainable(model, "adam")
    model.forward_backward([ROW], adapter_name="adam")
    before = {k: p.detach().clone() for k, p in params.items()}
    with pytest.raises(ValueError, match=r"\['momentum'\].*AdamW"):
        model.step_with(adapter_name="adam", optimizer_params={"momentum": 0.9})
    assert all(torch.equal(p, before[k]) for k, p in params.items())  # nothing stepped
    hyper = {"lr": 2e-3, "betas": [0.8, 0.9], "eps": 1e-6, "weight_decay": 0.1}
    model.step_with(adapter_name="adam", optimizer_params=hyper)
    optimizer = model._state("adam").optimizer
    for group in optimizer.param_groups:
        assert (group["lr"], group["betas"], group["eps"]) == (2e-3, (0.8, 0.9), 1e-6)
        assert group["weight_decay"] == 0.1
    assert any(not torch.equal(p, before[k]) for k, p in params.items())


def test_weight_decay_leaves_the_no_decay_group_alone():
    optimizer = build_optimizer(torch.nn.Linear(3, 2), "AdamW", lr=1e-3)
    set_param_groups(optimizer, {"weight_decay": 0.2, "lr": 0.1})
    decays = [(g["params"][0].ndim, g["weight_decay"], g["lr"]) for g in optimizer.param_groups]
    assert sorted(decays) == [(1, 0.0, 0.1), (2, 0.2, 0.1)]
    with pytest.raises(TypeError, match="optimizer_params must be a dict"):
        set_param_groups(optimizer, [("lr", 0.1)])


def test_step_with_needs_an_optimizer(model):
    model.add_adapter_to_model("bare", _lora())
    with pytest.raises(ValueError, match="step_with needs an optimizer"):
        model.step_with(adapter_name="bare")


def test_seeded_adapters_are_reproducible_and_leave_the_rng_alone(model):
    rng = torch.get_rng_state()
    model.add_seeded_adapter("s1", _lora(), seed=7)
    model.add_seeded_adapter("s2", _lora(), seed=7)
    assert torch.equal(torch.get_rng_state(), rng)
    first, second = _trainable(model, "s1"), _trainable(model, "s2")
    lora_a = [k for k in first if "lora_A" in k]
    assert lora_a
    for key in lora_a:
        assert torch.equal(first[key], second[key.replace(".s1.", ".s2.")])
    model.add_seeded_adapter("s3", _lora(), seed=8)
    third = _trainable(model, "s3")
    assert not torch.equal(first[lora_a[0]], third[lora_a[0].replace(".s1.", ".s3.")])


def test_vocab_size_and_model_folder(model):
    folder = Path(model.model_folder())
    assert (folder / "config.json").is_file()
    assert model.vocab_size() == model.model.config.vocab_size > 0


def _script():
    spec = importlib.util.spec_from_file_location("step_with_ddp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summed_step_under_ddp_matches_one_process(torchrun, tmp_path):
    """Two data ranks with one row each step like one process with both rows."""
    torchrun(SCRIPT, tmp_path, procs=2, timeout=300)
    got = torch.load(tmp_path / "step_with.pt")
    expected = _script().delta(None)
    assert set(got) == set(expected)
    assert any(float(t.abs().max()) > 1e-4 for t in expected.values())  # the step moved them
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_a_step_with_no_pass_since_the_last_times_zero_and_leaves_weights(model):
    """A data-parallel worker with no rows still steps with its peers: no pass since the last
    step must give a step time of 0 (not a tiny negative one, which the metric refuses)."""
    _sgd_step(model, "idle")
    params = _trainable(model, "idle")
    before = {k: p.detach().clone() for k, p in params.items()}
    model.step_with(adapter_name="idle", optimizer_params={"lr": LR})
    assert all(torch.equal(p.detach(), before[k]) for k, p in params.items())
    assert model.calculate_metric(adapter_name="idle")["step_time"] >= 0
    model.remove_adapter("idle")


@pytest.mark.parametrize("call", ["clip_grad_and_step", "step_with"])
def test_a_non_finite_gradient_is_refused_and_leaves_the_weights(model, call):
    """An overflow (here an infinite gradient entry) never reaches the weights: the step is
    refused naming the norm, the gradients are dropped, and the next step trains normally."""
    name = f"overflow_{call}"
    model.add_adapter_to_model(name, _lora())
    model.set_optimizer("AdamW", lr=1e-2, adapter_name=name)
    params = _trainable(model, name)
    before = {k: p.detach().clone() for k, p in params.items()}
    model.forward_backward([ROW], adapter_name=name)
    next(p for p in params.values() if p.grad is not None).grad.view(-1)[0] = float("inf")
    step = getattr(model, call)
    with pytest.raises(ValueError, match="the gradient's norm is inf: the step was refused"):
        step(adapter_name=name)
    assert all(torch.equal(p.detach(), before[k]) for k, p in params.items())
    assert all(p.grad is None for p in params.values())
    model.forward_backward([ROW], adapter_name=name)
    step(adapter_name=name)
    assert all(torch.isfinite(p).all() for p in params.values())
    assert any(not torch.equal(p.detach(), before[k]) for k, p in params.items())
    model.remove_adapter(name)
