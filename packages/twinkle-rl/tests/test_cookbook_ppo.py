"""The proof that PPO with a critic learns: a shortened run of cookbook/rl/ppo_arithmetic.py.

After the 150-step SFT warm start (as the GRPO recipe's test), 8 PPO steps of 16 prompts
raise the held-out mean reward (format plus accuracy, 0 to 2) by at least 0.3, and the
critic explains part of the returns' variance by the end. Figures with seeds are in
benchmarks/RESULTS.md (issue 17's section).
"""

import importlib.util
from pathlib import Path

COOKBOOK = Path(__file__).resolve().parents[3] / "cookbook" / "rl"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, COOKBOOK / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ppo_raises_the_held_out_reward():
    recipe = load("ppo_arithmetic")
    result = recipe.main(["--sft-steps", "150", "--ppo-steps", "8", "--prompts-per-step", "16"])
    before, after = result["before"], result["after"]
    assert after["reward"] - before["reward"] >= 0.3, result
    assert after["format"] > before["format"], result
    assert result["explained_variance"] > 0, result
