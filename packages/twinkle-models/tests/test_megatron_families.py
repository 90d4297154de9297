"""MegatronModel on the bundled tiny families beyond Qwen3 (scripts/megatron_families.py, one
launch of two CPU processes, gloo, about 2 minutes on 2 loaded cores): each family converts
from its Hugging Face weights and back bit for bit, and its logits, logps and three AdamW
steps match the one-process TransformersModel on the same seeded weights, encoded with the
family's own chat template.

Tolerances as test_megatron_parallel's: logits and logps 1e-5, losses 1e-5 after the first
step and 1e-4 after three, gradient norms 1e-4 relative; round trips and exports exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "megatron_families.py"
CASES = (
    "tiny-mistral:tp2",  # Llama's layer; vocabulary 1034 split in two
    "tiny-phi4:tp2",  # fused qkv_proj and gate_up_proj, untied head, vocabulary padded
    # GLM-4.5: half the head dimensions rotated, a dense first layer, sigmoid routing with a
    # random load-balancing bias, the shared experts split over tp (sequence parallel)
    "tiny-glm4.5+bias:tp2sp",
    # DeepSeek-V3: latent attention, group-limited sigmoid routing (2 groups) with a random
    # bias and a scaling factor, experts over dp2 × ep2; then a dense and an MoE stage
    "tiny-deepseek-v3+bias:ep2",
    # the rope key shared by every head keeps every tp rank's part of its gradient
    "tiny-deepseek-v3+bias:tp2sp",
    "tiny-deepseek-v3:pp2",
    "lora_peft:tiny-glm4.5@tp2sp",  # attention, experts and router, as peft adapts them
    # latent attention's down- and up-projections, the experts and the router (tp2 with an
    # MoE model needs sequence parallel)
    "lora_peft:tiny-deepseek-v3@tp2sp",
    "lora_refused:tiny-phi4",
)
LOGIT_TOL = 1e-5
FIRST_LOSS_TOL = 1e-5
LOSS_TOL = 1e-4


@pytest.fixture(scope="module")
def ranks(tmp_path_factory, torchrun) -> list[dict]:
    tmp = tmp_path_factory.mktemp("megatron_families")
    torchrun(SCRIPT, tmp, *CASES, procs=2, timeout=540)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


def check_equivalence(case: dict) -> None:
    assert case["logps_max_diff"] < LOGIT_TOL
    assert case["loss_diff"] < LOGIT_TOL
    if "logits_max_diff" in case:
        assert case["logits_max_diff"] < LOGIT_TOL
    assert case["round_trip_exact"] is True
    first, *rest = zip(case["losses"], case["reference_losses"], strict=True)
    assert abs(first[0] - first[1]) < FIRST_LOSS_TOL
    assert all(abs(a - b) < LOSS_TOL for a, b in rest)
    assert case["losses"][-1] < case["losses"][0]  # it trained
    for norm, ref in zip(case["grad_norms"], case["reference_grad_norms"], strict=True):
        assert abs(norm - ref) < LOSS_TOL * ref
    summed, reference_summed = case["summed_grad_norm"], case["reference_summed_grad_norm"]
    assert abs(summed - reference_summed) < LOSS_TOL * reference_summed
    assert case["metrics"]["tokens"] == case["reference_metrics"]["tokens"]


@pytest.mark.parametrize("case", [c for c in CASES if not c.startswith("lora_")])
def test_family_converts_and_trains_like_transformers_model(ranks, case):
    for rank in ranks:
        check_equivalence(rank[case])
    assert ranks[0][case]["export_exact"] is True


def test_lora_on_fused_projections_is_refused_naming_the_alternative(ranks):
    for rank in ranks:
        message = rank["lora_refused:tiny-phi4"]
        assert "qkv_proj, gate_up_proj" in message and "TransformersModel" in message


@pytest.mark.parametrize(
    "case",
    [
        "lora_peft:tiny-glm4.5@tp2sp",
        "lora_peft:tiny-deepseek-v3@tp2sp",
    ],
)
def test_lora_on_moe_families_trains_exports_and_resumes_like_peft(ranks, case):
    for rank in ranks:
        result = rank[case]
        assert result["base_frozen"] is True and result["trained_change"] > 0.1
        assert all(
            abs(a - b) < LOSS_TOL
            for a, b in zip(result["losses"], result["reference_losses"], strict=True)
        )
        assert result["resumed_logps_equal"] is True
    first = ranks[0][case]
    assert first["peft_logps_diff"] < LOGIT_TOL  # the saved adapter, loaded by peft
    assert first["merged_logps_diff"] < LOGIT_TOL  # the merged export, in transformers


def test_lora_on_latent_attention_adapts_its_projections_under_peft_names(ranks):
    adapted = ranks[0]["lora_peft:tiny-deepseek-v3@tp2sp"]["adapted"]
    latent = {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"}
    assert latent <= set(adapted) and "gate" in adapted  # the router, as peft adapts it
