"""A keyword no part of a call reads is refused before the forward (``check_loss_keywords``):
``forward_backward(inputs, advantage=...)`` must not train without the advantages.

Checked: the message names the keyword, the closest known name and the loss's inputs; no
forward runs and no gradient is kept; forward_only, calculate_loss and a batched tenant
pass refuse the same way; every registered loss declares its inputs; a user's loss that
declares none still gets every keyword, with one warning.
"""

import warnings

import pytest
import torch
from peft import LoraConfig

from twinkle.loss import LOSSES, CrossEntropyLoss, Loss, LossInputs
from twinkle.model import TransformersModel
from twinkle.model.loss_keywords import declared_inputs
from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel
from twinkle.model.transformers.tenant_pass import TenantRequest

MODEL_ID = "bundled://tiny-qwen3"
ROWS = [
    {"input_ids": [5, 9, 17, 33, 2, 40], "labels": [-100, -100, 17, 33, 2, 40]},
    {"input_ids": [7, 7, 120, 11], "labels": [-100, 7, 120, 11]},
]


def grpo_model() -> TransformersModel:
    model = TransformersModel(MODEL_ID)
    model.add_adapter_to_model("default", LoraConfig(r=4, target_modules="all-linear"))
    model.set_loss("GRPOLoss")
    return model


def decoder_forwards(model) -> list[int]:
    calls = [0]
    decoder = model._hf_model().get_decoder()
    decoder.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_a_misspelt_keyword_is_refused_before_the_forward():
    model = grpo_model()
    forwards = decoder_forwards(model)
    with pytest.raises(TypeError) as refused:
        model.forward_backward(ROWS, advantage=[1.0, -1.0])
    assert str(refused.value) == (
        "forward_backward got unknown keyword 'advantage' (did you mean 'advantages'?): "
        "nothing in the call reads it. The loss GRPOLoss accepts advantages (required), "
        "old_logps, ref_logps; forward_backward itself takes adapter_name, micro_batch_size, "
        "task, routing_replay"
    )
    assert forwards[0] == 0
    assert model._state(None).pending_tokens == 0
    assert all(p.grad is None for p in model.model.parameters())
    model.forward_backward(ROWS, advantages=[1.0, -1.0])  # the right name trains
    assert forwards[0] == 1 and model._state(None).pending_tokens > 0


def test_forward_only_and_calculate_loss_refuse_the_same_way():
    model = grpo_model()
    with pytest.raises(TypeError, match=r"forward_only got unknown keywords 'advantage' "):
        model.forward_only(ROWS, advantage=[1.0, -1.0], bogus=1)
    model.forward_only(ROWS, advantages=[1.0, -1.0])
    with pytest.raises(TypeError, match=r"'old_logp' \(did you mean 'old_logps'\?\)"):
        model.calculate_loss(advantages=[1.0, -1.0], old_logp=[[-1.0] * 4, [-1.0] * 3])
    # On-policy GRPO: minus the token-weighted advantage, (4 * 1 - 3 * 1) / 7 label tokens.
    assert model.calculate_loss(advantages=[1.0, -1.0]) == pytest.approx(-1 / 7, rel=1e-6)


def test_cross_entropy_reads_no_keyword():
    model = TransformersModel(MODEL_ID)
    with pytest.raises(TypeError, match="CrossEntropyLoss accepts no keyword inputs"):
        model.forward_backward(ROWS, advantages=[1.0, -1.0])
    with pytest.raises(TypeError, match=r"'micro_batch' \(did you mean 'micro_batch_size'\?\)"):
        model.forward_backward(ROWS, micro_batch=1)


def test_every_registered_loss_declares_its_inputs():
    classes = {name: LOSSES.get(name) for name in LOSSES.names()}
    undeclared = [n for n, cls in classes.items() if declared_inputs(cls.__new__(cls)) is None]
    assert undeclared == []
    assert LOSSES.get("DecoupledPPOLoss").reads.required == (
        "advantages",
        "old_logps",
        "prox_logps",
    )
    assert LOSSES.get("PPOLoss").reads.required == ("advantages", "old_logps")
    assert LOSSES.get("DPOLoss").reads.required == ("ref_logps",)
    assert LOSSES.get("GKDLoss").reads.required == ("teacher_logits",)
    assert LOSSES.get("PPOValueLoss").reads.names == ("returns", "old_values")


def test_each_declared_required_input_is_one_the_loss_refuses_to_run_without():
    """The declaration matches the code: without a required keyword the loss names it."""
    labels = torch.tensor([[-100, 3, 4, 5]])
    outputs = {"logps": torch.full((1, 4), -1.0), "values": torch.zeros(1, 4)}
    given = {
        "advantages": [1.0],
        "old_logps": torch.full((1, 4), -1.0),
        "prox_logps": torch.full((1, 4), -1.0),
        "returns": torch.zeros(1, 4),
        "old_values": torch.zeros(1, 4),
    }
    for name in ("GRPOLoss", "PPOLoss", "DecoupledPPOLoss", "GSPOLoss", "PPOValueLoss"):
        loss = LOSSES.get(name)()
        loss({"labels": labels}, outputs, **{k: given[k] for k in loss.reads.names if k in given})
        for missing in loss.reads.required:
            kwargs = {k: given[k] for k in loss.reads.required if k != missing}
            with pytest.raises(ValueError, match=missing):
                loss({"labels": labels}, outputs, **kwargs)


class ScaledCrossEntropy(Loss):
    """A user's loss written without ``reads``: it takes any keyword."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def __call__(self, inputs, outputs, **kwargs):
        self.seen.append(kwargs)
        result = CrossEntropyLoss()(inputs, outputs)
        return {**result, "loss": result["loss"] * kwargs.get("scale", 1.0)}


class ScaledFromCrossEntropy(CrossEntropyLoss):
    """The plugin page's shape: a built-in loss subclassed, its ``__call__`` overridden to
    read a keyword of its own; the parent's declaration does not cover it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[dict] = []

    def __call__(self, inputs, outputs, **kwargs):
        self.seen.append(kwargs)
        result = super().__call__(inputs, outputs)
        return {**result, "loss": result["loss"] * kwargs.get("scale", 1.0)}


@pytest.mark.parametrize("loss_cls", [ScaledCrossEntropy, ScaledFromCrossEntropy])
def test_a_users_loss_without_declared_inputs_gets_every_keyword_and_one_warning(loss_cls):
    model = TransformersModel(MODEL_ID)
    loss = loss_cls()
    model.set_loss(loss)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.forward_backward(ROWS, scale=2.0)
        model.forward_backward(ROWS, scale=3.0)
    assert [kw["scale"] for kw in loss.seen] == [2.0, 3.0]
    messages = [str(w.message) for w in caught if "declares no inputs" in str(w.message)]
    assert len(messages) == 1 and loss_cls.__name__ in messages[0]


class DeclaredScale(ScaledCrossEntropy):
    reads = LossInputs(optional=("scale",))


def test_a_users_loss_that_declares_its_inputs_is_checked():
    model = TransformersModel(MODEL_ID)
    model.set_loss(DeclaredScale())
    model.forward_backward(ROWS, scale=2.0)
    with pytest.raises(
        TypeError, match=r"'scal' \(did you mean 'scale'\?\).*DeclaredScale accepts scale"
    ):
        model.forward_backward(ROWS, scal=2.0)


def test_a_tenant_with_a_misspelt_keyword_fails_alone_in_a_batched_pass():
    model = MultiLoraTransformersModel(MODEL_ID, max_loras=2, max_rank=4, device="cpu")
    for name in ("alice", "bob"):
        model.add_adapter_to_model(name, LoraConfig(r=4, target_modules="all-linear"))
        model.set_loss("GRPOLoss", adapter_name=name)
    good = TenantRequest("alice", ROWS, {"advantages": [1.0, -1.0]})
    typo = TenantRequest("bob", ROWS, {"advantage": [1.0, -1.0]})
    want = model.forward_only(ROWS, adapter_name="alice", advantages=[1.0, -1.0])
    for run_pass in (model.forward_backward_many, model.forward_only_many):
        outcome, refused = run_pass([good, typo])
        assert outcome.logps.shape == want.logps.shape
        assert isinstance(refused, TypeError)
        assert "'advantage' (did you mean 'advantages'?)" in str(refused)
        assert model._states["bob"].pending_tokens == 0
