"""LR schedules: values against the formulas, exact resume, aliases, and bad arguments."""

import io
import math

import pytest
import torch

from twinkle.module import (
    LR_SCHEDULERS,
    ConstantWarmupScheduler,
    CosineWarmupScheduler,
    LinearWarmupScheduler,
    build_lr_scheduler,
)


def expected_factor(step, warmup, total, min_ratio, kind):
    """The documented schedule, written out independently of the implementation."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if kind == "constant":
        return 1.0
    if step >= total:
        return min_ratio
    progress = (step - warmup) / (total - warmup)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1 - progress
    return min_ratio + (1 - min_ratio) * shape


def make_optimizer(lrs=(0.1,)):
    groups = [{"params": [torch.nn.Parameter(torch.ones(2))], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups)


def run(scheduler, steps):
    """The lr of every group at steps 0..steps-1, stepping like a training loop does."""
    values = []
    for _ in range(steps):
        values.append([group["lr"] for group in scheduler.optimizer.param_groups])
        scheduler.optimizer.step()
        scheduler.step()
    return values


@pytest.mark.parametrize(
    ("cls", "kind"), [(CosineWarmupScheduler, "cosine"), (LinearWarmupScheduler, "linear")]
)
def test_decay_schedules_follow_the_formula(cls, kind):
    warmup, total, min_ratio, peaks = 4, 14, 0.1, (0.2, 0.05)
    scheduler = cls(make_optimizer(peaks), warmup, total, min_lr_ratio=min_ratio)
    values = run(scheduler, total + 3)
    for step, lrs in enumerate(values):
        factor = expected_factor(step, warmup, total, min_ratio, kind)
        assert lrs == pytest.approx([peak * factor for peak in peaks], rel=1e-12), step
    assert values[0][0] == pytest.approx(0.2 / 5)  # warmup start: never 0
    assert values[warmup][0] == pytest.approx(0.2)  # warmup end: the peak
    middle = warmup + (total - warmup) // 2
    assert values[middle][0] == pytest.approx(0.2 * (0.1 + 0.9 * 0.5))  # halfway down
    assert values[total][0] == values[-1][0] == pytest.approx(0.2 * 0.1)  # the floor


def test_constant_schedule():
    scheduler = ConstantWarmupScheduler(make_optimizer(), num_warmup_steps=3)
    assert [lrs[0] for lrs in run(scheduler, 6)] == pytest.approx(
        [0.025, 0.05, 0.075, 0.1, 0.1, 0.1]
    )


def test_no_warmup_starts_at_the_peak():
    scheduler = CosineWarmupScheduler(make_optimizer(), num_training_steps=4)
    assert [lrs[0] for lrs in run(scheduler, 5)] == pytest.approx(
        [0.1 * expected_factor(s, 0, 4, 0.0, "cosine") for s in range(5)]
    )
    assert scheduler.get_last_lr() == [0.0]


@pytest.mark.parametrize("name", ["CosineWarmupScheduler", "LinearWarmupScheduler"])
def test_state_round_trip_mid_schedule_continues_identically(name):
    kwargs = {"num_warmup_steps": 3, "num_training_steps": 20}
    reference = build_lr_scheduler(make_optimizer(), name, **kwargs)
    run(reference, 7)
    buffer = io.BytesIO()
    torch.save(reference.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)

    resumed = build_lr_scheduler(make_optimizer(), name, **kwargs)
    resumed.load_state_dict(state)
    # A fresh optimizer gets the resumed lr at once, not only after the next step.
    assert resumed.optimizer.param_groups[0]["lr"] == reference.optimizer.param_groups[0]["lr"]
    assert resumed.get_last_lr() == reference.get_last_lr()
    assert run(resumed, 16) == run(reference, 16)


def test_megatron_style_aliases_and_default_name():
    optimizer = make_optimizer((1.0,))
    scheduler = build_lr_scheduler(optimizer, "default", lr_decay_steps=10, max_lr=0.3)
    assert isinstance(scheduler, CosineWarmupScheduler)
    reference = CosineWarmupScheduler(make_optimizer((0.3,)), num_training_steps=10)
    assert run(scheduler, 12) == run(reference, 12)

    warm = build_lr_scheduler(
        make_optimizer(), "LinearWarmupScheduler", lr_warmup_steps=2, lr_decay_steps=6
    )
    assert (warm.num_warmup_steps, warm.num_training_steps) == (2, 6)


def test_alias_and_name_together_is_an_error():
    with pytest.raises(ValueError, match="lr_decay_steps is an alias of num_training_steps"):
        CosineWarmupScheduler(make_optimizer(), num_training_steps=5, lr_decay_steps=5)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_warmup_steps": -1, "num_training_steps": 5}, ValueError, "num_warmup_steps"),
        ({"num_training_steps": 0}, ValueError, "num_training_steps must be >= 1"),
        ({"num_training_steps": -3}, ValueError, "num_training_steps must be >= 1"),
        ({"num_training_steps": 5.0}, TypeError, "num_training_steps must be an int"),
        ({}, ValueError, "needs num_training_steps"),
        ({"num_training_steps": 5, "min_lr_ratio": 1.5}, ValueError, "min_lr_ratio"),
        ({"num_training_steps": 5, "max_lr": -1e-4}, ValueError, "max_lr"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        CosineWarmupScheduler(make_optimizer(), **kwargs)


def test_warmup_longer_than_the_run_warns_and_warms_up_throughout(capsys):
    # The user's client example passes num_warmup_steps=500 for a 10-step run.
    scheduler = CosineWarmupScheduler(make_optimizer(), num_warmup_steps=500, num_training_steps=10)
    assert "exceeds num_training_steps" in capsys.readouterr().err
    lrs = [lrs[0] for lrs in run(scheduler, 10)]
    assert lrs == pytest.approx([0.1 * (s + 1) / 501 for s in range(10)])


def test_torch_schedulers_by_name():
    assert isinstance(
        build_lr_scheduler(make_optimizer(), "LinearLR"), torch.optim.lr_scheduler.LinearLR
    )
    cosine = build_lr_scheduler(make_optimizer(), "CosineAnnealingLR", T_max=4, eta_min=0)
    assert isinstance(cosine, torch.optim.lr_scheduler.CosineAnnealingLR)
    assert LR_SCHEDULERS.get("StepLR") is torch.optim.lr_scheduler.StepLR


def test_a_keyword_the_scheduler_does_not_take_lists_the_accepted_ones():
    with pytest.raises(ValueError, match="CosineAnnealingLR does not accept num_training_steps"):
        build_lr_scheduler(make_optimizer(), "CosineAnnealingLR", num_training_steps=4)


def test_unknown_scheduler_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown lr scheduler 'Cosine'.*CosineWarmupScheduler"):
        build_lr_scheduler(make_optimizer(), "Cosine")


def test_scheduler_needs_an_optimizer():
    with pytest.raises(TypeError, match="needs a torch Optimizer"):
        build_lr_scheduler(torch.nn.Linear(2, 2), "LinearLR")
