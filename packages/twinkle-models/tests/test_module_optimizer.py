"""build_optimizer: names resolve, no decay on norms and biases, frozen params stay out."""

import pytest
import torch
from torch import nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from twinkle.module import OPTIMIZERS, build_optimizer


class ScaleNorm(nn.Module):
    """A norm whose parameter is 2-D, so only the module rule can keep it out of decay."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(2, 4))


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4)
        self.out = nn.Linear(4, 4, bias=False)
        self.ln = nn.LayerNorm(4)
        self.rms = Qwen3RMSNorm(4)
        self.scale_norm = ScaleNorm()
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)


def groups_by_decay(optimizer):
    return {
        group["weight_decay"]: {id(p) for p in group["params"]} for group in optimizer.param_groups
    }


def ids(*params):
    return {id(p) for p in params}


def test_norms_biases_and_1d_params_get_no_decay_and_frozen_params_are_left_out():
    model = Tiny()
    optimizer = build_optimizer(model, "AdamW", weight_decay=0.1, lr=1e-3)
    groups = groups_by_decay(optimizer)
    assert groups[0.1] == ids(model.embed.weight, model.proj.weight, model.out.weight)
    assert groups[0.0] == ids(
        model.proj.bias, model.ln.weight, model.ln.bias, model.rms.weight, model.scale_norm.weight
    )
    all_ids = set().union(*groups.values())
    assert not all_ids & ids(*model.frozen.parameters())
    assert all(group["lr"] == 1e-3 for group in optimizer.param_groups)


def test_weight_decay_none_keeps_the_optimizer_default():
    optimizer = build_optimizer(Tiny(), "AdamW")
    assert sorted(group["weight_decay"] for group in optimizer.param_groups) == [0.0, 0.01]
    optimizer = build_optimizer(Tiny(), "SGD", lr=0.1)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0, 0.0]


def test_decay_shrinks_only_the_decay_group():
    model = Tiny()
    optimizer = build_optimizer(model, "AdamW", weight_decay=0.5, lr=0.1)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    assert torch.allclose(model.proj.weight, before["proj.weight"] * (1 - 0.1 * 0.5))
    for name in ["proj.bias", "ln.weight", "rms.weight", "scale_norm.weight"]:
        assert torch.equal(dict(model.named_parameters())[name], before[name]), name


def test_tied_parameter_is_counted_once():
    model = nn.Sequential(nn.Embedding(6, 3), nn.Linear(3, 6, bias=False))
    model[1].weight = model[0].weight
    optimizer = build_optimizer(model, "AdamW")
    assert [len(group["params"]) for group in optimizer.param_groups] == [1]


def test_iterable_of_tensors_uses_the_dimension_rule():
    matrix, vector = nn.Parameter(torch.ones(2, 2)), nn.Parameter(torch.ones(2))
    frozen = nn.Parameter(torch.ones(2, 2), requires_grad=False)
    optimizer = build_optimizer([matrix, vector, frozen], "AdamW", weight_decay=0.2)
    assert groups_by_decay(optimizer) == {0.2: ids(matrix), 0.0: ids(vector)}


def test_only_matrices_gives_a_single_group():
    model = nn.Linear(3, 3, bias=False)
    optimizer = build_optimizer(model, torch.optim.AdamW, weight_decay=0.3)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.3]


def test_default_name_is_adamw_and_every_torch_optimizer_is_known():
    assert OPTIMIZERS.get("default") is torch.optim.AdamW
    for name in ["SGD", "Adam", "AdamW", "Adafactor", "RMSprop"]:
        assert OPTIMIZERS.get(name) is getattr(torch.optim, name)
    assert type(build_optimizer(Tiny(), "default", lr=1e-4)) is torch.optim.AdamW


class NoDecaySGD(torch.optim.Optimizer):
    """A custom optimizer without a weight_decay argument."""

    def __init__(self, params, lr: float = 0.1) -> None:
        super().__init__(params, {"lr": lr})

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.data.add_(p.grad, alpha=-group["lr"])


def test_custom_optimizer_class():
    model = Tiny()
    optimizer = build_optimizer(model, NoDecaySGD, lr=0.5)
    assert isinstance(optimizer, NoDecaySGD)
    assert len(optimizer.param_groups) == 1
    assert sum(len(g["params"]) for g in optimizer.param_groups) == 8
    with pytest.raises(ValueError, match="no weight_decay argument"):
        build_optimizer(model, NoDecaySGD, weight_decay=0.1)


def test_custom_subclass_of_a_torch_optimizer_gets_groups():
    class MyAdamW(torch.optim.AdamW):
        pass

    optimizer = build_optimizer(Tiny(), MyAdamW, weight_decay=0.1)
    assert isinstance(optimizer, MyAdamW) and len(optimizer.param_groups) == 2


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown optimizer 'AdamX'.*AdamW.*SGD"):
        build_optimizer(Tiny(), "AdamX")


def test_a_class_that_is_not_an_optimizer_is_rejected():
    with pytest.raises(TypeError, match="must subclass Optimizer"):
        build_optimizer(Tiny(), nn.Linear)


def test_unknown_keyword_lists_the_accepted_ones():
    with pytest.raises(ValueError, match=r"AdamW does not accept momentum; it accepts: lr, betas"):
        build_optimizer(Tiny(), "AdamW", momentum=0.9)


@pytest.mark.parametrize("weight_decay", [-0.1, "0.1", True])
def test_bad_weight_decay(weight_decay):
    with pytest.raises((ValueError, TypeError), match="weight_decay"):
        build_optimizer(Tiny(), "AdamW", weight_decay=weight_decay)


def test_no_trainable_parameters_is_an_error():
    model = Tiny().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build_optimizer(model)


def test_non_tensor_items_are_rejected():
    with pytest.raises(TypeError, match="item 1 is str"):
        build_optimizer([nn.Parameter(torch.ones(2)), "w"])


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"lr": float("inf")}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"lr": torch.tensor(float("inf"))}, "lr"),
        ({"eps": float("nan")}, "eps"),
        ({"betas": (0.9, float("nan"))}, "betas"),
        ({"weight_decay": float("inf")}, "weight_decay"),
    ],
)
def test_non_finite_optimizer_arguments_are_refused(kwargs, name):
    """torch's range checks are comparisons: ``lr=inf`` passes them and the first step turns
    every trained weight into NaN."""
    with pytest.raises(ValueError, match=rf"optimizer AdamW: {name} must be a finite number"):
        build_optimizer(Tiny(), "AdamW", **kwargs)
    build_optimizer(Tiny(), "AdamW", lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)


@pytest.mark.parametrize(("name", "value"), [("lr", "1e-3"), ("lr", [1]), ("eps", True)])
def test_an_argument_that_takes_a_number_refuses_anything_else(name, value):
    """torch compares it (``0.0 <= lr``) and fails with a TypeError that names no argument."""
    with pytest.raises(ValueError, match=rf"optimizer AdamW: {name} must be a number, got"):
        build_optimizer(Tiny(), "AdamW", **{name: value})
