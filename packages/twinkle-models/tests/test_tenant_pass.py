"""Tenants batched into one forward and backward equal each tenant run alone.

Two pools start identical; one runs each tenant's forward_backward by itself, the other runs
them together with forward_backward_many. Tenants differ in LoRA rank, targets, dropout,
loss, batch size and sequence lengths. Compared: losses, logps, token counts, every
gradient, the weights after a step and a second round (dropout streams carried on).
"""

import pytest
import torch
from peft import LoraConfig

from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel
from twinkle.model.transformers.tenant_pass import TenantRequest
from twinkle.processor import InputProcessor
from twinkle.utils.testing import reduction_tolerance

BASE = "bundled://tiny-qwen3"
HIDDEN_TERMS = 64 * 4  # the longest sums: the MLP's intermediate width of the tiny model

# Each tenant's optimizer is its own. SGD: Adam divides each update by the gradient's own
# size, so a near-zero gradient's rounding becomes a full-size difference in the step.
OPTIMIZERS = {
    "alice": {"lr": 0.1},
    "bob": {"lr": 0.05, "momentum": 0.9},
    "carol": {"lr": 0.2, "weight_decay": 0.01},
    "dave": {"lr": 0.1},
}
TENANTS = {
    "alice": LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear"),
    "bob": LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "lm_head"]),
    "carol": LoraConfig(
        r=2, lora_alpha=4, lora_dropout=0.2, target_modules=["gate_proj", "down_proj"]
    ),
    "dave": LoraConfig(r=16, lora_alpha=16, lora_dropout=0.1, target_modules=["o_proj", "up_proj"]),
}


def _pool() -> MultiLoraTransformersModel:
    model = MultiLoraTransformersModel(BASE, max_loras=4, max_rank=16, device="cpu")
    for name, config in TENANTS.items():
        model.add_adapter_to_model(name, config)
        model.set_optimizer("SGD", adapter_name=name, **OPTIMIZERS[name])
    model.set_loss("GRPOLoss", adapter_name="bob")
    # dave's rows stay padded in the forward; the others' padded rows run packed, as alone.
    model.set_processor(InputProcessor(padding_free=False), adapter_name="dave")
    return model


def _count_decoder_forwards(model) -> list[int]:
    calls = [0]
    decoder = model._hf_model().get_decoder()
    decoder.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _rows(seed: int, count: int, longest: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        ids = torch.randint(1, 200, (longest - 2 * i,), generator=generator).tolist()
        rows.append({"input_ids": ids, "labels": [-100, -100, *ids[2:]]})
    return rows


def _requests(round_: int) -> list[TenantRequest]:
    b_rows = _rows(10 + round_, 3, 9)
    return [
        TenantRequest("alice", _rows(round_, 2, 14)),
        TenantRequest(
            "bob",
            b_rows,
            {
                "advantages": [0.5, -1.0, 2.0],
                "old_logps": [[-5.0] * (len(r["input_ids"]) - 2) for r in b_rows],
            },
        ),
        TenantRequest("carol", _rows(20 + round_, 1, 21)),  # no padding: not packed
        TenantRequest("dave", _rows(30 + round_, 3, 11)),
    ]


def _alone(model, request: TenantRequest):
    return model.forward_backward(
        request.inputs, adapter_name=request.adapter_name, **request.loss_kwargs
    )


def _params(model, name: str, attr: str = "grad") -> dict[str, torch.Tensor]:
    values = {}
    for key, param in model.model.named_parameters():
        if f".{name}." in key:
            value = param.grad if attr == "grad" else param.data
            values[key] = None if value is None else value.detach().clone()
    return values


def _assert_close(actual, expected):
    tol = reduction_tolerance(expected, terms=HIDDEN_TERMS)
    torch.testing.assert_close(actual, expected, **tol)


@pytest.fixture
def pools():
    return _pool(), _pool()


def test_a_batched_step_equals_each_tenant_run_alone(pools):
    alone, batched = pools
    forwards = _count_decoder_forwards(batched)
    for round_ in range(2):
        requests = _requests(round_)
        expected = [_alone(alone, r) for r in requests]
        outcomes = batched.forward_backward_many(requests)
        assert forwards[0] == 2 * (round_ + 1)  # one for the packed layout, one for the padded
        for request, want, got in zip(requests, expected, outcomes, strict=True):
            assert not isinstance(got, Exception), got
            assert got.num_tokens == want.num_tokens
            assert got.loss == pytest.approx(want.loss, rel=1e-6)
            _assert_close(got.logps, want.logps)
            grads_alone, grads = (
                _params(alone, request.adapter_name),
                _params(batched, request.adapter_name),
            )
            assert grads.keys() == grads_alone.keys()
            for key, grad in grads_alone.items():
                assert grad is not None, f"{key} has no gradient"
                _assert_close(grads[key], grad)
        for name in TENANTS:
            alone.clip_grad_and_step(adapter_name=name)
            batched.clip_grad_and_step(adapter_name=name)
            weights_alone, weights = _params(alone, name, "data"), _params(batched, name, "data")
            for key, value in weights_alone.items():
                _assert_close(weights[key], value)
    # The tenants' own accounting: the same metrics as alone.
    for name in TENANTS:
        want, got = (
            alone.calculate_metric(adapter_name=name),
            batched.calculate_metric(adapter_name=name),
        )
        assert got.keys() == want.keys()
        for key in ("loss", "num_tokens", "accuracy"):
            if key in want:
                assert got[key] == pytest.approx(want[key], rel=1e-6), key


def test_after_a_pass_only_the_active_adapter_is_trainable(pools):
    _, batched = pools
    batched.forward_backward_many(_requests(5))
    active = batched.model.active_adapter
    for key, param in batched.model.named_parameters():
        if "lora_" in key:
            assert param.requires_grad == (f".{active}." in key), key
    assert not any("forward" in vars(layer) for layer in batched.model.modules())


def test_one_tenants_bad_rows_fail_its_request_alone(pools):
    alone, batched = pools
    good = TenantRequest("alice", _rows(7, 2, 10))
    vocab = batched.vocab_size()
    out_of_vocabulary = TenantRequest(
        "bob", [{"input_ids": [1, vocab + 5, 3], "labels": [-100, 2, 3]}]
    )
    no_label_tokens = TenantRequest(
        "carol",
        [
            {"input_ids": [1, 2, 3, 4], "labels": [-100] * 4},
            {"input_ids": [5, 6], "labels": [-100] * 2},
        ],
    )
    nan_advantages = TenantRequest(
        "bob", _rows(8, 1, 6), {"advantages": [float("nan")], "old_logps": [[-1.0] * 4]}
    )
    forwards = _count_decoder_forwards(batched)
    # The first is refused as it is collated, the second by its loss after the shared forward,
    # the third before any forward.
    for requests, shared_forwards in (
        ([out_of_vocabulary, good, no_label_tokens], 1),
        ([good, nan_advantages], 1),
    ):
        forwards[0] = 0
        for model in pools:
            for name in TENANTS:
                model.zero_grad(adapter_name=name)
        want = alone.forward_backward(good.inputs, adapter_name="alice")
        outcomes = batched.forward_backward_many(requests)
        assert forwards[0] == shared_forwards
        for request, outcome in zip(requests, outcomes, strict=True):
            if request is good:
                assert outcome.loss == pytest.approx(want.loss, rel=1e-6)
                _assert_close(outcome.logps, want.logps)
                continue
            with pytest.raises(ValueError) as alone_error:
                _alone(alone, request)
            assert isinstance(outcome, ValueError)
            assert str(outcome) == str(alone_error.value)
            grads = _params(batched, request.adapter_name)
            assert all(g is None or not g.any() for g in grads.values())
            assert batched._states[request.adapter_name].pending_tokens == 0
        for key, grad in _params(alone, "alice").items():
            _assert_close(_params(batched, "alice")[key], grad)


def test_what_cannot_share_a_pass_runs_alone_with_its_own_result(pools):
    alone, batched = pools
    rows = _rows(3, 3, 8)
    requests = [
        TenantRequest("alice", rows, {"micro_batch_size": 1}),
        TenantRequest("nobody", rows),
    ]
    outcomes = batched.forward_backward_many(requests)
    want = alone.forward_backward(rows, adapter_name="alice", micro_batch_size=1)
    assert outcomes[0].loss == pytest.approx(want.loss, rel=1e-6)
    assert isinstance(outcomes[1], ValueError) and "nobody" in str(outcomes[1])


def test_dora_adapters_run_alone():
    model = MultiLoraTransformersModel(BASE, max_loras=2, max_rank=8, device="cpu")
    model.add_adapter_to_model("plain", LoraConfig(r=4, target_modules="all-linear"))
    model.add_adapter_to_model("dora", LoraConfig(r=4, target_modules="all-linear", use_dora=True))
    from twinkle.model.transformers.tenant_pass import solo_reason

    assert "variant" in solo_reason(model, TenantRequest("dora", []))
    assert solo_reason(model, TenantRequest("plain", [])) is None
    outcomes = model.forward_backward_many(
        [TenantRequest("plain", _rows(1, 2, 8)), TenantRequest("dora", _rows(2, 2, 8))]
    )
    assert all(not isinstance(o, Exception) and o.num_tokens > 0 for o in outcomes)


def test_an_adapter_named_twice_runs_its_calls_in_order(pools):
    alone, batched = pools
    # One row each: no padding, so all three share the padded layout.
    first, second = _rows(40, 1, 9), _rows(41, 1, 12)
    expected = [alone.forward_backward(rows, adapter_name="alice") for rows in (first, second)]
    outcomes = batched.forward_backward_many(
        [TenantRequest("alice", first), TenantRequest("carol", _rows(42, 1, 5))]
        + [TenantRequest("alice", second)]
    )
    for want, got in zip(expected, (outcomes[0], outcomes[2]), strict=True):
        assert got.loss == pytest.approx(want.loss, rel=1e-6)  # alice draws dropout: in order
    for key, grad in _params(alone, "alice").items():
        _assert_close(_params(batched, "alice")[key], grad)


def test_a_batched_evaluation_equals_each_tenant_evaluated_alone(pools):
    """forward_only_many: one forward for the layout, each tenant's loss, logps, evaluation
    metrics and calculate_loss those of its forward_only alone; no gradient anywhere."""
    alone, batched = pools
    forwards = _count_decoder_forwards(batched)
    vocab = batched.vocab_size()
    bad = TenantRequest("carol", [{"input_ids": [1, vocab + 3, 3], "labels": [-100, 2, 3]}])
    requests = [*_requests(7)[:2], bad, _requests(7)[3]]
    outcomes = batched.forward_only_many(requests)
    assert forwards[0] == 2  # the packed layout (alice, bob), the padded one (dave)
    for request, got in zip(requests, outcomes, strict=True):
        if request is bad:
            with pytest.raises(ValueError) as alone_error:
                _alone_eval(alone, request)
            assert isinstance(got, ValueError) and str(got) == str(alone_error.value)
            continue
        want = _alone_eval(alone, request)
        assert not isinstance(got, Exception), got
        assert got.num_tokens == want.num_tokens
        assert got.loss == pytest.approx(want.loss, rel=1e-6)
        _assert_close(got.logps, want.logps)
        name = request.adapter_name
        kwargs = request.loss_kwargs
        assert batched.calculate_loss(adapter_name=name, **kwargs) == pytest.approx(
            alone.calculate_loss(adapter_name=name, **kwargs), rel=1e-6
        )
        want_metric = alone.calculate_metric(is_training=False, adapter_name=name)
        got_metric = batched.calculate_metric(is_training=False, adapter_name=name)
        assert got_metric.keys() == want_metric.keys()
        for key in ("loss", "num_tokens", "accuracy"):
            if key in want_metric:
                assert got_metric[key] == pytest.approx(want_metric[key], rel=1e-6), key
    for name in TENANTS:
        assert all(g is None for g in _params(batched, name).values()), name
    # Training afterwards runs in training mode again (dropout back on).
    assert batched.forward_backward_many(_requests(8))[0].num_tokens > 0
    assert batched.model.training


def _alone_eval(model, request: TenantRequest):
    return model.forward_only(
        request.inputs, adapter_name=request.adapter_name, **request.loss_kwargs
    )
