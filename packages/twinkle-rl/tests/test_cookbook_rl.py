"""The proof that it learns: shortened runs of the cookbook's RL recipes.

GRPO: after a 150-step SFT warm start, 15 GRPO steps raise the held-out mean reward (format
plus accuracy, 0 to 2) clearly: by at least 0.3. Measured (seed 0): 0.350 -> 0.850 for this
run (7 s on a quiet machine), 0.475 -> 1.363 for the full recipe (600 SFT, 60 GRPO steps).
DPO: 10 steps move the implicit reward margin of the training pairs above 0.5 (it starts
at 0: the reference is the initial policy).
PPO with a critic: after the same warm start, 8 PPO steps of 16 prompts raise the held-out
reward by at least 0.3 (measured: 0.350 -> 0.812) and the critic explains part of the
returns' variance by the end.
GKD: a teacher 2.9x the student's size taught the task (60 SFT steps), then 10 on-policy
GKD steps bring the untrained student's KL(student || teacher) on the held-out answers down
by more than a fifth (measured, seed 0: 8.13 -> 5.22).
On-policy distillation (reverse KL as the advantage): after the same teacher and 10 SFT
steps of the student, 10 steps lower the student's held-out KL to the teacher at both
evaluations (steps 5 and 10), by more than 2.5% in all (measured 2026-12-02 with these
arguments, 10 steps: seed 0 7.77 -> 7.66 -> 7.40, 4.8%; seed 1 8.10 -> 7.46, 7.9%; seed 2
8.21 -> 7.71, 6.1%; seed 3 7.55 -> 6.92, 8.4%; seed 0 gives the same figures run after
another seed in one process).
"""

import importlib.util
import statistics
from pathlib import Path

COOKBOOK = Path(__file__).resolve().parents[3] / "cookbook" / "rl"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, COOKBOOK / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grpo_raises_the_held_out_reward():
    recipe = load("grpo_arithmetic")
    result = recipe.main(["--sft-steps", "150", "--grpo-steps", "15"])
    before, after = result["before"], result["after"]
    assert after["reward"] - before["reward"] >= 0.3, result
    assert after["format"] > before["format"], result


def test_dpo_grows_the_reward_margin():
    recipe = load("dpo_preferences")
    result = recipe.main(["--steps", "10"])
    assert result["train_margin"] > 0.5, result


def test_ppo_raises_the_held_out_reward():
    recipe = load("ppo_arithmetic")
    result = recipe.main(["--sft-steps", "150", "--ppo-steps", "8", "--prompts-per-step", "16"])
    before, after = result["before"], result["after"]
    assert after["reward"] - before["reward"] >= 0.3, result
    assert after["format"] > before["format"], result
    # The critic explains part of the return's variance on most steps once it has trained
    # one (seed 0: [-0.017, 0.171, 0.207, -0.458, 0.225, 0.126, 0.288, -0.074]); one
    # step's figure swings with the rollout the policy just drew.
    assert statistics.median(result["explained_variance"][1:]) > 0, result


def test_gkd_lowers_the_held_out_kl_to_the_teacher():
    recipe = load("distil_arithmetic")
    curve = recipe.main(["--teacher-steps", "60", "--steps", "10"])["held_out_kl"]
    assert curve[-1] < 0.8 * curve[0], curve
    assert curve[1] < curve[0], curve


def test_on_policy_distillation_lowers_the_held_out_kl_to_the_teacher():
    recipe = load("distil_arithmetic")
    argv = ["--method", "reverse-kl", "--teacher-steps", "60", "--steps", "10", "--seed", "0"]
    curve = recipe.main(argv)["held_out_kl"]
    assert len(curve) == 3 and curve[2] < curve[1] < curve[0], curve
    assert curve[-1] < 0.975 * curve[0], curve
