"""The agentic recipe end to end, shortened: SFT warm start, multi-turn GRPO through
AsyncRollouts with k = 1. That the held-out success rises takes the full recipe (minutes:
the copying the tool loop needs is learned after ~500 SFT steps), measured in its
docstring and in benchmarks/RESULTS.md; here the run's bookkeeping is checked."""

import importlib.util
from pathlib import Path

import pytest

RECIPE = Path(__file__).resolve().parents[3] / "cookbook" / "agentic" / "grpo_calculator.py"


def load_recipe():
    spec = importlib.util.spec_from_file_location("grpo_calculator", RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    return recipe


def test_agentic_grpo_runs_asynchronously_within_the_staleness_bound():
    recipe = load_recipe()
    argv = ["--sft-steps", "10", "--grpo-steps", "3", "--tasks-per-step", "2"]
    argv += ["--num-generations", "2", "--max-staleness", "1", "--eval-samples", "1"]
    result = recipe.main(argv)
    assert len(result["staleness"]) == 3 and set(result["staleness"]) == {0, 1}
    assert result["dropped"] == 0
    for staleness, (low, high) in zip(result["staleness"], result["ratio_range"], strict=True):
        if staleness == 0:  # sampled by the trained weights: the importance ratio is 1
            assert abs(low - 1) < 1e-3 and abs(high - 1) < 1e-3
    assert 0 <= result["before"] <= 1 and 0 <= result["after"] <= 1
    assert [round(s, 6) for s in (result["curve"][0][1], result["curve"][-1][1])] == [
        round(result["before"], 6),
        round(result["after"], 6),
    ]
    assert 0 <= result["trainer_idle_fraction"] <= 1


def test_decoupled_ppo_weighs_batches_by_the_trainer_s_policy_before_the_update():
    """With DecoupledPPOLoss the proximal logps are the trainer's weights before the update
    (model.policy_logps), so with one update per batch the behaviour-to-proximal weights
    are the ratios to the sampler itself: 1 on a batch the trained weights sampled (up to
    the sampler's numerics), and whatever the staleness made them on a stale one. (This
    shortened run's rewards are all 0, so its policy does not move; the loss's arithmetic
    on stale batches is tested in twinkle-models' test_loss_decoupled.)"""
    argv = ["--sft-steps", "10", "--grpo-steps", "3", "--tasks-per-step", "2"]
    argv += ["--num-generations", "2", "--max-staleness", "1", "--eval-samples", "1"]
    result = load_recipe().main([*argv, "--loss", "DecoupledPPOLoss"])
    assert set(result["staleness"]) == {0, 1} and result["dropped"] == 0
    assert len(result["is_weights"]) == 3
    steps = zip(result["staleness"], result["is_weights"], result["ratio_range"], strict=True)
    for staleness, (mean, top), (_, ratio_max) in steps:
        assert 0 < mean <= top <= 5.0  # the default truncation
        assert abs(top - min(ratio_max, 5.0)) < 1e-3 * top
        if staleness == 0:
            assert abs(mean - 1) < 1e-3 and abs(top - 1) < 1e-3


def test_several_updates_per_batch_keep_one_proximal_policy_per_batch():
    """``--updates-per-batch 2``: two optimizer steps on each rollout batch, one weight sync
    after them, and DecoupledPPOLoss's proximal logps taken once, before the first (the
    later update's trust region stays centred on the policy before the batch)."""
    import random

    from twinkle.env import arithmetic_tasks

    recipe = load_recipe()
    argv = ["--sft-steps", "10", "--grpo-steps", "3", "--tasks-per-step", "2"]
    argv += ["--num-generations", "2", "--eval-samples", "1", "--loss", "DecoupledPPOLoss"]
    args = recipe.parse_args([*argv, "--updates-per-batch", "2", "--max-staleness", "1"])
    train, held_out = arithmetic_tasks("train"), arithmetic_tasks("test")[:2]
    model = recipe.warm_start(args, random.Random(0), train)
    calls = {"policy_logps": 0, "clip_grad_and_step": 0}
    for name in calls:
        method = getattr(model, name)

        def counted(*a, _method=method, _name=name, **kw):
            calls[_name] += 1
            return _method(*a, **kw)

        setattr(model, name, counted)
    result = recipe.run_grpo(model, args, random.Random(1), train, held_out)
    assert calls == {"policy_logps": 3, "clip_grad_and_step": 6}
    assert len(result["ratio_range"]) == len(result["clip_fraction"]) == 3
    assert set(result["staleness"]) <= {0, 1} and result["dropped"] == 0
    with pytest.raises(SystemExit):
        recipe.parse_args(["--updates-per-batch", "0"])
