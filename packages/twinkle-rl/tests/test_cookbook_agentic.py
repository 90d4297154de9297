"""The agentic recipe end to end, shortened: SFT warm start, multi-turn GRPO through
AsyncRollouts with k = 1. That the held-out success rises takes the full recipe (minutes:
the copying the tool loop needs is learned after ~500 SFT steps), measured in its
docstring and in benchmarks/RESULTS.md; here the run's bookkeeping is checked."""

import importlib.util
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[3] / "cookbook" / "agentic" / "grpo_calculator.py"


def test_agentic_grpo_runs_asynchronously_within_the_staleness_bound():
    spec = importlib.util.spec_from_file_location("grpo_calculator", RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
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
