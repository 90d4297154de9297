"""The agentic recipe (cookbook/agentic/grpo_calculator.py) with ``--backend megatron``,
shortened: MegatronModel (its CPU mode) warm-starts, scores the proximal logps with
``policy_logps`` and trains DecoupledPPOLoss, its weights synced to TorchSampler through a
folder. Run in a child process, which owns the one-process group MegatronModel makes. (This
shortened run's rewards are all 0, so the policy does not move; the Megatron losses are
tested against TransformersModel in twinkle-models' test_megatron_scoring.)"""

import json
import subprocess
import sys
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[3] / "cookbook" / "agentic" / "grpo_calculator.py"
RUN = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("grpo_calculator", sys.argv[1])
recipe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recipe)
result = recipe.main(sys.argv[3:])
open(sys.argv[2], "w").write(json.dumps(result))
"""


def test_decoupled_ppo_recipe_trains_with_megatron_model(tmp_path):
    argv = ["--sft-steps", "10", "--grpo-steps", "3", "--tasks-per-step", "2"]
    argv += ["--num-generations", "2", "--max-staleness", "1", "--eval-samples", "1"]
    argv += ["--loss", "DecoupledPPOLoss", "--backend", "megatron"]
    out = tmp_path / "result.json"
    command = [sys.executable, "-c", RUN, str(RECIPE), str(out), *argv]
    done = subprocess.run(command, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads(out.read_text())
    assert set(result["staleness"]) == {0, 1} and result["dropped"] == 0
    steps = zip(result["staleness"], result["is_weights"], result["ratio_range"], strict=True)
    for staleness, (mean, top), (_, ratio_max) in steps:
        assert 0 < mean <= top <= 5.0  # the default truncation
        assert abs(top - min(ratio_max, 5.0)) < 1e-3 * top
        if staleness == 0:
            # Fresh samples: MegatronModel's policy_logps equal the sampler's logprobs after
            # the folder sync (a wrong sync or misaligned logps moves these far from 1).
            assert abs(mean - 1) < 1e-3 and abs(top - 1) < 1e-3
