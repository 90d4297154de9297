"""Tinker's losses: each formula's gradient against its closed form, the user errors, and,
on the tiny model, the datum alignment (logprobs equal a direct log-softmax of the model on
the datum's tokens) and the sum semantics (chunks add; the step applies the plain sum)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from peft import LoraConfig

from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel
from twinkle.server.errors import BadRequest
from twinkle.server.tinker import model_ops
from twinkle.server.tinker.batch import build_batch
from twinkle.server.tinker.codec import FwdBwdRequest, TinkerDatum
from twinkle.server.tinker.losses import build_tinker_loss
from twinkle.utils.testing import reduction_tolerance

LABELS = torch.tensor([[-100, 3, 4, 5, 6], [-100, 7, 8, -100, -100]])
MASK = LABELS != -100
RNG = torch.Generator().manual_seed(0)
OLD = torch.where(MASK, -torch.rand(2, 5, generator=RNG) * 2, 0)
ADV = torch.where(MASK, torch.randn(2, 5, generator=RNG), 0)
WEIGHTS = torch.where(MASK, torch.randn(2, 5, generator=RNG), 0)  # negatives included


def grad_of(name: str, config: dict, logps: torch.Tensor, **inputs) -> tuple[float, torch.Tensor]:
    logps = logps.clone().requires_grad_(True)
    loss = build_tinker_loss(name, config)({"labels": LABELS}, {"logps": logps}, **inputs)["loss"]
    loss.backward()
    return float(loss.detach()), logps.grad


def policy_logps(shift: float) -> torch.Tensor:
    return torch.where(MASK, OLD + shift * ADV.sign() * torch.rand(2, 5, generator=RNG), 0)


def test_cross_entropy_is_the_weighted_sum_with_any_real_weights():
    logps = policy_logps(0.3)
    value, grad = grad_of("cross_entropy", {}, logps, weights=WEIGHTS)
    assert value == pytest.approx(float(-(WEIGHTS * logps)[MASK].sum()), rel=1e-6)
    torch.testing.assert_close(grad, torch.where(MASK, -WEIGHTS, 0))  # no division by tokens


def test_importance_sampling_gradient_is_minus_ratio_times_advantage():
    logps = policy_logps(0.3)
    value, grad = grad_of("importance_sampling", {}, logps, logprobs=OLD, advantages=ADV)
    ratio = torch.exp(logps - OLD)
    assert value == pytest.approx(float(-(ratio * ADV)[MASK].sum()), rel=1e-6)
    torch.testing.assert_close(grad, torch.where(MASK, -ratio * ADV, 0))


def test_ppo_clips_with_the_configured_thresholds():
    logps = policy_logps(0.6)  # ratios well outside [0.9, 1.1]
    config = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    value, grad = grad_of("ppo", config, logps, logprobs=OLD, advantages=ADV)
    ratio = torch.exp(logps - OLD)
    objective = torch.minimum(ratio * ADV, ratio.clamp(0.9, 1.1) * ADV)
    assert value == pytest.approx(float(-objective[MASK].sum()), rel=1e-6)
    clipped = ((ADV > 0) & (ratio > 1.1)) | ((ADV < 0) & (ratio < 0.9))
    assert bool(clipped[MASK].any()) and bool((~clipped)[MASK].any())
    torch.testing.assert_close(grad, torch.where(MASK & ~clipped, -ratio * ADV, 0))
    _, default_grad = grad_of("ppo", {}, logps, logprobs=OLD, advantages=ADV)
    assert not torch.allclose(default_grad, grad)  # 0.8/1.2 by default: fewer tokens clipped


def test_cispo_keeps_every_tokens_gradient_with_a_capped_weight():
    logps = policy_logps(0.6)
    value, grad = grad_of("cispo", {}, logps, logprobs=OLD, advantages=ADV)
    weight = torch.exp(logps - OLD).clamp(0.8, 1.2)
    assert value == pytest.approx(float(-(weight * logps * ADV)[MASK].sum()), rel=1e-6)
    torch.testing.assert_close(grad, torch.where(MASK, -weight * ADV, 0))


def test_dro_is_the_advantage_term_minus_a_quadratic_penalty():
    logps = policy_logps(0.6)
    value, grad = grad_of("dro", {"beta": 0.5}, logps, logprobs=OLD, advantages=ADV)
    expected = -(logps * ADV - 0.25 * (logps - OLD) ** 2)
    assert value == pytest.approx(float(expected[MASK].sum()), rel=1e-6)
    torch.testing.assert_close(grad, torch.where(MASK, -(ADV - 0.5 * (logps - OLD)), 0))


@pytest.mark.parametrize(
    "name, config, message",
    [
        ("gspo", {}, "not supported"),
        ("stable_reinforce", {"kl_coeff": 0.1}, "not supported"),
        ("custom", {"loss_id": "x"}, "not supported"),
        ("ppo", {"epsilon": 0.2}, "not accepted"),
        ("cross_entropy", {"beta": 1.0}, "not accepted"),
        ("ppo", {"clip_low_threshold": 1.5, "clip_high_threshold": 1.2}, "clip_low"),
        ("ppo", {"clip_low_threshold": "low"}, "must be a number"),
        ("dro", {}, "needs"),
        ("dro", {"beta": -1.0}, "beta >= 0"),
        ("cispo", {"clip_high_threshold": float("inf")}, "finite"),
    ],
)
def test_unknown_losses_and_config_are_user_errors(name, config, message):
    with pytest.raises(BadRequest, match=message):
        build_tinker_loss(name, config)


def test_missing_extra_or_non_finite_inputs_are_user_errors():
    loss = build_tinker_loss("importance_sampling", {})
    logps = {"logps": OLD}
    with pytest.raises(BadRequest, match=r"missing \['advantages'\]"):
        loss({"labels": LABELS}, logps, logprobs=OLD)
    with pytest.raises(BadRequest) as refused:
        loss.check_inputs(["logprobs", "advantage", "weights"])
    assert str(refused.value) == (
        "loss_fn_inputs 'advantage' (did you mean 'advantages'?), 'weights' not read by "
        "'importance_sampling': it takes target_tokens and logprobs, advantages"
    )
    loss.check_inputs(["logprobs", "advantages"])
    with pytest.raises(BadRequest, match="NaN"):
        loss({"labels": LABELS}, logps, logprobs=OLD, advantages=ADV * float("nan"))


# ---- on the tiny model, through the Tinker model ops -------------------------------------


@pytest.fixture(scope="module")
def service():
    model = MultiLoraTransformersModel("bundled://tiny-qwen3", device="cpu", max_rank=8)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    torch.manual_seed(0)  # nonzero LoRA B: the adapter changes the logits
    model.add_adapter_to_model("run", lora)
    svc = SimpleNamespace(config=SimpleNamespace(mode="embedded"), model=model)
    model_ops.prepare_run(svc, "run")
    return svc


DATA = [
    TinkerDatum(
        [5, 17, 42, 9, 88, 3],
        {
            "target_tokens": np.array([17, 42, 9, 88, 3, 250]),
            "weights": np.array([0, 0, 1, 1, -0.5, 2], dtype=np.float32),
        },
    ),
    TinkerDatum(
        [7, 7, 120],
        {
            "target_tokens": np.array([7, 120, 11]),
            "weights": np.array([1, 1, 1], dtype=np.float32),
        },
    ),
]


def run(service, data, forward_only=False, loss_fn="cross_entropy", config=None):
    """One forward_backward request as the route runs it: build_batch, then the model op."""
    request = FwdBwdRequest("sess:train:0", 1, loss_fn, config or {}, forward_only, data)
    loss = build_tinker_loss(request.loss_fn, request.loss_fn_config)
    model = service.model
    vocab = model._hf_model().get_output_embeddings().out_features
    batch, inputs, lengths = build_batch(request.data, vocab, model.pad_token_id())
    return model_ops.forward_backward(
        service, "run", batch, inputs, lengths, loss, request.forward_only
    )


def direct(model, datum: TinkerDatum) -> torch.Tensor:
    """log_softmax(model(t))[i, y[i]]: the datum's logprobs computed straight from the model."""
    tokens = torch.tensor([datum.tokens])
    logits = model.model(input_ids=tokens).logits[0].float()
    targets = torch.as_tensor(datum.inputs["target_tokens"])
    return logits.log_softmax(-1).gather(-1, targets[:, None])[:, 0]


def lora_grads(model) -> dict[str, torch.Tensor]:
    return {
        n: p.grad.clone()
        for n, p in model.model.named_parameters()
        if "lora_" in n and p.grad is not None
    }


def test_forward_logprobs_are_the_models_logprob_of_each_target(service):
    outputs, metrics = run(service, DATA, forward_only=True)
    model = service.model
    with torch.no_grad():
        expected = [direct(model, datum) for datum in DATA]
    # tolerance: float32 with padding and an attention mask against one unpadded row
    for output, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(output["logprobs"], want.numpy(), atol=1e-5)
    weighted = sum(
        -(torch.as_tensor(d.inputs["weights"]) * e).sum()
        for d, e in zip(DATA, expected, strict=True)
    )
    assert metrics["loss:sum"] == pytest.approx(float(weighted), rel=1e-5)


def test_chunks_add_up_and_the_step_applies_the_plain_sum(service):
    model = service.model
    model.zero_grad(adapter_name="run")
    for datum in DATA:  # two chunks, as the SDK sends a large batch
        run(service, [datum])
    chunked = lora_grads(model)
    model.zero_grad(adapter_name="run")
    model.model.set_adapter("run")
    total = sum(-(torch.as_tensor(d.inputs["weights"]) * direct(model, d)).sum() for d in DATA)
    total.backward()
    reference = lora_grads(model)
    assert chunked.keys() == reference.keys() and chunked
    # float32 sums in another order: the longest is the log-softmax over the vocabulary
    vocab = model._hf_model().get_output_embeddings().out_features
    for name, grad in chunked.items():
        tol = reduction_tolerance(reference[name], terms=vocab)
        torch.testing.assert_close(grad, reference[name], **tol, msg=lambda m, n=name: f"{n}: {m}")
    # The step divides by nothing: the clip sees the norm of the summed gradient.
    model.zero_grad(adapter_name="run")
    for datum in DATA:
        run(service, [datum])
    params = {**model_ops.ADAM_DEFAULTS, "grad_clip_norm": 1e9}
    metrics = model_ops.optim_step(service, "run", params)
    norm = torch.sqrt(sum(g.double().square().sum() for g in reference.values()))
    assert metrics["grad_norm:mean"] == pytest.approx(float(norm), rel=1e-4)
