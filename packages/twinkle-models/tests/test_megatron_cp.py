"""MegatronModel with context parallel (our attention, no Transformer Engine) on CPU (gloo)
against the one-process TransformersModel on the same weights.

Two launches of scripts/megatron_cp.py: two processes (cp2 on the tiny Qwen3 with a packed
batch and GRPO steps, cp2 on a tiny Qwen3-MoE, LoRA under cp2) and four processes (tp2 × cp2
with sequence parallel, pp2 × cp2, pp2 × vpp2 × cp2, dp2 × cp2, dp2 × cp2 × ep2 on the MoE).
No GPU here: MegatronModel runs in its CPU mode (gloo; ``twinkle.model.megatron.cpu_mode``).

Tolerances as in test_megatron_parallel: logits and logps agree to 1e-5 (float32 summation
order differs across shards); losses to 1e-5 after the first AdamW step and 1e-4 after
three (AdamW amplifies rounding); gradient norms to 1e-4 relative, and the GRPO steps' norms
(after four AdamW steps) to 3e-4: 7.9e-5 and 1.1e-4 measured with the real Qwen3 template's
rows. Their first step's loss is exactly 0 on both sides only when old_logps line up with
the cp padding, which the loss check holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from twinkle.model.megatron.context_parallel import sequence_chunks

SCRIPT = Path(__file__).parent / "scripts" / "megatron_cp.py"
LOGIT_TOL = 1e-5
FIRST_LOSS_TOL = 1e-5
LOSS_TOL = 1e-4
GRPO_NORM_RTOL = 3e-4


def _torchrun(torchrun, tmp: Path, procs: int, *cases: str) -> dict:
    torchrun(SCRIPT, tmp, *cases, procs=procs, timeout=300)
    ranks = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(procs)]
    # Every rank returns the whole sequence's results.
    for case in cases:
        for other in ranks[1:]:
            if "losses" in ranks[0][case]:
                assert other[case]["losses"] == ranks[0][case]["losses"]
    return ranks[0]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, torchrun) -> dict:
    return _torchrun(torchrun, tmp_path_factory.mktemp("cp_2"), 2, "cp2", "cp2moe", "cp2lora")


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory, torchrun) -> dict:
    cases = ("tp2cp2", "pp2cp2", "vpp2cp2", "dp2cp2", "dp2cp2ep2")
    return _torchrun(torchrun, tmp_path_factory.mktemp("cp_4"), 4, *cases)


def _check_equivalence(case: dict, data_parallel: bool = False) -> None:
    assert case["cp"] == 2
    assert case["logps_shape_equal"] is True  # the padding to 2 × cp chunks is dropped
    assert case["logps_max_diff"] < LOGIT_TOL
    assert case["loss_diff"] < LOGIT_TOL
    if "logits_max_diff" in case:
        assert case["logits_max_diff"] < LOGIT_TOL
    first, *rest = zip(case["losses"], case["reference_losses"], strict=True)
    assert abs(first[0] - first[1]) < FIRST_LOSS_TOL
    assert all(abs(a - b) < LOSS_TOL for a, b in rest)
    assert case["losses"][-1] < case["losses"][0]  # it trained
    for norm, ref in zip(case["grad_norms"], case["reference_grad_norms"], strict=True):
        assert abs(norm - ref) < LOSS_TOL * ref
    summed, reference_summed = case["summed_grad_norm"], case["reference_summed_grad_norm"]
    assert abs(summed - reference_summed) < LOSS_TOL * reference_summed
    if not data_parallel:  # metrics are per data rank
        assert case["metrics"]["tokens"] == case["reference_metrics"]["tokens"]


# ---- the split itself -----------------------------------------------------------------------


def test_sequence_chunks_follow_megatrons_load_balanced_split():
    # 2 × cp chunks; rank r holds chunks r and 2 × cp - 1 - r.
    assert sequence_chunks(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert sequence_chunks(8, 2, 1).tolist() == [2, 3, 4, 5]
    every = torch.cat([sequence_chunks(16, 4, r) for r in range(4)])
    assert sorted(every.tolist()) == list(range(16))
    with pytest.raises(ValueError, match="length 10 is not a multiple of 4"):
        sequence_chunks(10, 2, 0)


# ---- two processes --------------------------------------------------------------------------


def test_cp2_matches_transformers_model(two_ranks):
    case = two_ranks["cp2"]
    _check_equivalence(case)
    assert case["padded_length"] % 4 == 0


def test_cp2_runs_packed_batches_as_rows(two_ranks):
    case = two_ranks["cp2"]
    assert case["packed_logps_shape_equal"] is True
    assert case["packed_logps_max_diff"] < LOGIT_TOL
    assert case["packed_loss_diff"] < LOGIT_TOL


def test_cp2_grpo_steps_match_with_per_token_loss_arguments(two_ranks):
    # old_logps (per token) must follow the padding the cp split adds.
    case = two_ranks["cp2"]
    for mine, ref in zip(case["grpo_losses"], case["grpo_reference_losses"], strict=True):
        assert abs(mine - ref) < LOSS_TOL
    norms = case["grpo_grad_norms"]
    half = len(norms) // 2
    for mine, ref in zip(norms[:half], norms[half:], strict=True):
        assert abs(mine - ref) < GRPO_NORM_RTOL * ref


def test_cp2_on_a_mixture_of_experts_model(two_ranks):
    _check_equivalence(two_ranks["cp2moe"])


def test_cp2_lora_trains_like_peft_and_exports(two_ranks):
    case = two_ranks["cp2lora"]
    for mine, ref in zip(case["losses"], case["reference_losses"], strict=True):
        assert abs(mine - ref) < LOSS_TOL
    assert case["trained_change"] > 1e-3
    assert case["base_frozen"] is True
    assert case["peft_logps_diff"] < LOGIT_TOL
    assert case["merged_logps_diff"] < LOGIT_TOL
    assert case["resumed_logps_equal"] is True
    assert "cp 2" in case["configs"]


# ---- four processes -------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["tp2cp2", "pp2cp2", "vpp2cp2", "dp2cp2", "dp2cp2ep2"])
def test_cp2_combined_with_other_parallelism(four_ranks, layout):
    _check_equivalence(four_ranks[layout], data_parallel=layout.startswith("dp"))
