"""MegatronModel's ``policy_logps`` and the DecoupledPPOLoss path (issue 18) against the
one-process TransformersModel on the same rows and seeded weights (scripts/megatron_scoring.py,
one launch of two CPU processes, gloo): tp2, cp2 and pp2, three AdamW steps each with the
proximal logps taken by ``policy_logps`` just before each update, as the agentic recipe does.

Tolerances as test_megatron_parallel's: logps 1e-5 on the first (untrained) pass and 1e-4
after AdamW steps (measured 2.5e-5), losses 1e-5 then 1e-4, gradient norms 1e-4 relative.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "megatron_scoring.py"
LAYOUTS = ("tp2", "cp2", "pp2")
TOL = 1e-5
TRAINED_TOL = 1e-4


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, torchrun) -> list[dict]:
    tmp = tmp_path_factory.mktemp("megatron_scoring")
    torchrun(SCRIPT, tmp, *LAYOUTS, procs=2, timeout=540)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_policy_logps_and_decoupled_ppo_match_transformers_model(ranks, layout):
    for rank in ranks:
        case = rank[layout]
        shape, reference_shape = case["shapes"]
        assert shape == reference_shape  # (B, T), aligned with the labels as the reference's
        first, *trained = case["prox_diffs"]
        assert first < TOL and all(diff < TRAINED_TOL for diff in trained)
        pairs = list(zip(case["losses"], case["reference_losses"], strict=True))
        assert abs(pairs[0][0] - pairs[0][1]) < TOL
        assert all(abs(a - b) < TRAINED_TOL for a, b in pairs[1:])
        assert case["losses"][-1] < case["losses"][0]  # it trained
        for norm, ref in zip(case["grad_norms"], case["reference_grad_norms"], strict=True):
            assert abs(norm - ref) < TRAINED_TOL * ref
        assert case["scoring_left_no_tokens"] is True  # no loss ran, no tokens were counted
        assert case["is_truncated_fraction"] > 0  # the stale behaviour logps were corrected
    assert ranks[0][layout]["prox_sum"] == ranks[1][layout]["prox_sum"]  # the same on every rank


def test_policy_logps_refuses_routing_replay_and_unlabelled_rows(ranks):
    errors = ranks[0]["tp2"]["errors"]
    assert "MegatronModel does not record experts" in errors["routing_replay"]
    assert "give the batch labels" in errors["no_labels"]
