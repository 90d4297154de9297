"""MegatronModel (the Ray GRPO sample's model) as the documents drive it, one CPU process each.

* ``old_logps`` in the documents' shapes (scripts/megatron_rl_inputs.py): per-row floats and
  the sampler's ``(token_id, logprob)`` lists give the (B, T) tensor's loss in micro-batches,
  and a short row is named as the caller's row.
* The Qwen3.5 page's evaluation loop (scripts/megatron_eval.py): forward_only,
  calculate_loss, calculate_metric(is_training=False), leaving the training alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


def test_old_logps_in_the_documents_shapes_on_megatron(tmp_path, child_env):
    command = [sys.executable, str(SCRIPTS / "megatron_rl_inputs.py"), str(tmp_path)]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads((tmp_path / "rl_inputs.json").read_text())
    losses = result["losses"]
    # The same float32 old logps placed at the same positions: the same loss, bit for bit.
    assert losses["floats"] == losses["tensor"] and losses["pairs"] == losses["tensor"]
    # The old logps are the model's own (forward_only on the whole batch, the training pass in
    # micro-batches of 2: float32 sums over other padded shapes), so every ratio is 1.
    assert result["logp_mismatch"] < 1e-4
    n = result["row_lengths"][3]
    expected = f"old_logps[3] has {n - 1} values but row 3 of the batch has {n} label tokens"
    assert result["short_row_error"] is not None and expected in result["short_row_error"]


def test_the_pages_evaluation_loop_on_megatron(tmp_path, child_env):
    command = [sys.executable, str(SCRIPTS / "megatron_eval.py"), str(tmp_path)]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    result = json.loads((tmp_path / "eval.json").read_text())
    for batch in result["evaluated"]:
        # One summed loss over one count, read three ways (the metric may divide in float32).
        assert batch["calculate_loss"] == batch["forward_only"]
        assert batch["metric"]["loss"] == pytest.approx(batch["forward_only"], rel=4 * 2**-23)
    assert result["evaluated"][0]["forward_only"] != result["evaluated"][1]["forward_only"]
    before, after = result["pending_tokens"]
    assert before > 0 and after == before  # the open training window kept its token count
    assert result["training_metrics"] == pytest.approx(result["untouched_training_metrics"])
    assert "call forward_only(inputs)" in (result["after_forward_backward"] or "")
    # actor.forward(input_data), as the DeviceMesh page's data flow calls it
    assert result["forward_equals_forward_only"] and result["forward_rows"] == 4
    assert "call forward_backward(inputs, ...)" in (result["backward_error"] or "")
