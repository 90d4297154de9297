"""A unit stepped before set_optimizer gets the documented default, AdamW at lr 1e-5 for the
full model and 1e-4 for a LoRA adapter, with a log line saying so; it steps exactly as that
optimizer set explicitly would, and an optimizer the user set is left alone."""

import pytest
import torch
from peft import LoraConfig

from twinkle.model import TransformersModel
from twinkle.model.default_optimizer import DEFAULT_FULL_LR, DEFAULT_LORA_LR
from twinkle.template import build_template

MODEL_ID = "bundled://tiny-qwen3"


@pytest.fixture(scope="module")
def features():
    template = build_template("Qwen3_5Template", model_id=MODEL_ID)
    conversations = [
        {
            "messages": [
                {"role": "user", "content": f"Who are you? ({i})"},
                {"role": "assistant", "content": "I am Twinkle." + " Really." * i},
            ]
        }
        for i in range(4)
    ]
    return template.batch_encode(conversations)


def lora_model() -> TransformersModel:
    model = TransformersModel(MODEL_ID)
    torch.manual_seed(0)  # the same LoRA init in every model built here
    model.add_adapter_to_model("default", LoraConfig(r=4, target_modules="all-linear"))
    return model


def one_step(model: TransformersModel, features, step=None) -> None:
    model.forward_backward(features)
    if step is None:
        model.clip_grad_and_step()
    else:
        step(model)


def assert_same_parameters(a: TransformersModel, b: TransformersModel) -> None:
    pairs = zip(a.model.named_parameters(), b.model.named_parameters(), strict=True)
    for (name, x), (_, y) in pairs:
        assert torch.equal(x, y), f"{name} differs: the same computation in the same order"


def test_full_training_defaults_to_adamw_at_1e_5_and_says_so(features, capsys):
    assert DEFAULT_FULL_LR == 1e-5
    default, explicit = TransformersModel(MODEL_ID), TransformersModel(MODEL_ID)
    explicit.set_optimizer("AdamW", lr=1e-5)
    capsys.readouterr()
    one_step(default, features)
    err = capsys.readouterr().err
    assert "clip_grad_and_step: the full model has no optimizer" in err
    assert "default AdamW(lr=1e-05) (full-parameter training)" in err
    assert "set_optimizer(...)" in err
    one_step(explicit, features)
    assert "has no optimizer" not in capsys.readouterr().err
    optimizer = default._state(None).optimizer
    assert type(optimizer) is torch.optim.AdamW
    assert [group["lr"] for group in optimizer.param_groups] == [1e-5, 1e-5]
    assert_same_parameters(default, explicit)
    assert default.calculate_metric()["lr"] == pytest.approx(1e-5)


def test_a_lora_adapter_defaults_to_adamw_at_1e_4_once(features, capsys):
    assert DEFAULT_LORA_LR == 1e-4
    default, explicit = lora_model(), lora_model()
    explicit.set_optimizer("AdamW", lr=1e-4)
    capsys.readouterr()
    for _ in range(2):
        one_step(default, features)
        one_step(explicit, features)
    err = capsys.readouterr().err
    assert err.count("has no optimizer") == 1, "logged when the default is set, not every step"
    assert "adapter 'default' has no optimizer" in err and "AdamW(lr=0.0001) (LoRA" in err
    assert_same_parameters(default, explicit)
    names = {id(p): n for n, p in default.model.named_parameters()}
    groups = default._state(None).optimizer.param_groups
    assert all("lora_" in names[id(p)] for group in groups for p in group["params"])


def test_step_and_clip_grad_norm_called_alone_get_the_default_too(features, capsys):
    def clip_then_step(model):
        model.clip_grad_norm(1.0)
        model.step()
        model.zero_grad()

    default, explicit = lora_model(), lora_model()
    explicit.set_optimizer("AdamW", lr=1e-4)
    one_step(default, features, clip_then_step)
    one_step(explicit, features, clip_then_step)
    assert "clip_grad_norm: adapter 'default' has no optimizer" in capsys.readouterr().err
    assert_same_parameters(default, explicit)


def test_an_optimizer_the_user_set_is_kept(features, capsys):
    model = TransformersModel(MODEL_ID)
    model.set_optimizer("SGD", lr=0.5)
    one_step(model, features)
    assert "has no optimizer" not in capsys.readouterr().err
    assert type(model._state(None).optimizer) is torch.optim.SGD


def test_step_with_still_needs_an_explicit_optimizer(features):
    model = TransformersModel(MODEL_ID)
    model.forward_backward(features)
    with pytest.raises(ValueError, match=r"step_with needs an optimizer: call set_optimizer\("):
        model.step_with(optimizer_params={"lr": 1e-4})
