"""MegatronModel on CPU (gloo) against the one-process TransformersModel on the same weights.

Three launches, each running several cases (scripts/megatron_single.py and
scripts/megatron_parallel.py): one process; two processes (tp2, pp2, dp2 with and
without the distributed optimizer, pp2 × vpp2,
dp2 × ep2 on a tiny Qwen3-MoE, a checkpoint saved under tp2 resumed under dp2, and LoRA
under tp2); four processes (tp2 × pp2, and pp2 × dp2 × ep2 on the MoE without top-k
renormalisation).
No GPU here: MegatronModel runs in its CPU mode (gloo; ``twinkle.model.megatron.cpu_mode``).

Tolerances: logits and logps agree to 1e-5 (float32 summation order differs across
shards); the reference and Megatron losses agree to 1e-6 at the first step and, as
AdamW amplifies rounding, to 1e-4 after three steps; gradient norms to 1e-4 relative.
Weight round trips and resumes are exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
LOGIT_TOL = 1e-5
FIRST_LOSS_TOL = 1e-6
LOSS_TOL = 1e-4


def _torchrun(torchrun, tmp: Path, procs: int, *cases: str) -> list[dict]:
    torchrun(SCRIPTS / "megatron_parallel.py", tmp, *cases, procs=procs, timeout=540)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(procs)]


@pytest.fixture(scope="module")
def single(tmp_path_factory, child_env) -> dict:
    tmp = tmp_path_factory.mktemp("megatron_single")
    command = [sys.executable, str(SCRIPTS / "megatron_single.py"), str(tmp)]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads((tmp / "single.json").read_text())


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, torchrun) -> list[dict]:
    cases = ("tp2", "pp2", "dp2", "dp2dist", "vpp", "ep2", "resume", "lora")
    return _torchrun(torchrun, tmp_path_factory.mktemp("megatron_2"), 2, *cases)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory, torchrun) -> list[dict]:
    return _torchrun(torchrun, tmp_path_factory.mktemp("megatron_4"), 4, "tp2pp2", "pp2ep2")


def _check_equivalence(case: dict) -> None:
    assert case["logps_max_diff"] < LOGIT_TOL
    assert case["loss_diff"] < LOGIT_TOL
    if "logits_max_diff" in case:
        assert case["logits_max_diff"] < LOGIT_TOL
    assert case["round_trip_exact"] is True
    first, *rest = zip(case["losses"], case["reference_losses"], strict=True)
    assert abs(first[0] - first[1]) < FIRST_LOSS_TOL * 10
    assert all(abs(a - b) < LOSS_TOL for a, b in rest)
    assert case["losses"][-1] < case["losses"][0]  # it trained
    for norm, ref in zip(case["grad_norms"], case["reference_grad_norms"], strict=True):
        assert abs(norm - ref) < LOSS_TOL * ref
    summed, reference_summed = case["summed_grad_norm"], case["reference_summed_grad_norm"]
    assert abs(summed - reference_summed) < LOSS_TOL * reference_summed
    # every rank reports the whole batch's metrics, summed over its data-parallel peers
    assert case["metrics"]["tokens"] == case["reference_metrics"]["tokens"]


# ---- one process --------------------------------------------------------------------------


def test_losses_of_the_documents_loop_match_transformers_model(single):
    losses, reference = single["losses"], single["reference_losses"]
    assert abs(losses[0] - reference[0]) < FIRST_LOSS_TOL
    assert all(abs(a - b) < LOSS_TOL for a, b in zip(losses, reference, strict=True))
    assert losses[-1] < losses[0] - 0.5
    metrics, ref_metrics = single["metrics"], single["reference_metrics"]
    assert metrics["tokens"] == ref_metrics["tokens"]
    assert metrics["lr"] == pytest.approx(ref_metrics["lr"])  # the 'default' cosine schedule
    assert metrics["grad_norm"] == pytest.approx(ref_metrics["grad_norm"], rel=1e-4)
    assert "tp 1, pp 1" in single["train_configs"]


def test_micro_batches_accumulation_and_three_call_step_equal_one_batch(single):
    one = single["one_batch"]
    assert single["micro_batches"] == pytest.approx(one, abs=1e-6)
    assert single["accumulated"] == pytest.approx(one[-1], abs=1e-6)
    assert single["three_call"] == pytest.approx(one[-1], abs=1e-6)


def test_grpo_loss_with_advantages_matches_transformers_model(single):
    losses, reference = single["grpo_losses"], single["grpo_reference_losses"]
    assert losses == pytest.approx(reference, abs=LOSS_TOL)
    assert losses[1] != losses[0]  # the policy moved


def test_packed_batches_match_transformers_model_in_the_packed_layout(single):
    packed = single["packed"]
    # two cross-entropy steps, then a GRPO step with packed old_logps and per-sequence
    # advantages
    assert packed["losses"] == pytest.approx(packed["reference_losses"], abs=LOSS_TOL)
    assert abs(packed["losses"][0] - packed["reference_losses"][0]) < FIRST_LOSS_TOL
    assert packed["logps_shape"] == packed["input_shape"]  # [1, total], as the input
    assert packed["logps_max_diff"] < LOGIT_TOL


def test_forward_only_without_labels_gives_no_loss(single):
    assert single["no_labels"] == {"loss": None, "logps_numel": 0}


def test_resume_reproduces_the_uninterrupted_losses_exactly(single):
    assert single["progress"] == {"consumed_train_samples": 8, "step": 2}
    assert single["resumed_losses"] == single["losses"][2:]
    files = single["checkpoint_files"]
    assert {"config.json", "trainer_state.json", "megatron/layout.json"} <= set(files)
    assert "megatron/rank_00000.pt" in files and "tokenizer.json" in files
    assert single["hf_load_logps_diff"] < LOGIT_TOL  # TransformersModel loads the checkpoint


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("optimizer", "wraps 'default', 'AdamW', 'SGD'"),
        ("optimizer_kwarg", "['foo']"),
        ("adapter", "add the adapter before setting the optimizer"),
        ("left_padding", "needs right padding"),
        ("micro_batch", "micro_batch_size=3"),
        ("world", "covers 2 ranks"),
        ("no_tokens", "no label tokens"),
    ],
)
def test_bad_inputs_fail_with_a_clear_error(single, name, expected):
    assert expected in (single["errors"][name] or "")


def test_a_refused_call_leaves_the_model_usable(single):
    assert single["still_trains"] == pytest.approx(single["one_batch"][-1], abs=1e-6)


# ---- two processes ------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["tp2", "pp2", "dp2", "dp2dist", "vpp", "ep2"])
def test_parallel_layout_matches_transformers_model(two_ranks, case):
    for rank in two_ranks:
        _check_equivalence(rank[case])
    assert two_ranks[0][case]["export_exact"] is True


def test_pipeline_stages_hold_their_own_layers(two_ranks):
    first, last = (set(r["pp2"]["stage_tensor_names"]) for r in two_ranks)
    assert "model.layers.0.mlp.down_proj.weight" in first - last
    assert "model.layers.1.mlp.down_proj.weight" in last - first
    # interleaved: stage 0 holds layers 0 and 2 of the 4-layer model
    vpp_first = set(two_ranks[0]["vpp"]["stage_tensor_names"])
    assert {"model.layers.0.input_layernorm.weight", "model.layers.2.input_layernorm.weight"} <= (
        vpp_first
    )
    assert "model.layers.1.input_layernorm.weight" not in vpp_first


def test_expert_parallel_ranks_export_every_expert(two_ranks):
    names = set(two_ranks[0]["ep2"]["stage_tensor_names"])
    assert {"model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.gate.weight"} <= names
    assert two_ranks[0]["ep2"]["export_exact"] is True  # all 4 experts, from both ranks


def test_resume_under_another_layout_restores_weights_only(two_ranks):
    for rank in two_ranks:
        case = rank["resume"]
        assert "tp 2 -> 1, dp 1 -> 2" in case["full_resume_error"]
        assert "resume_only_model=True" in case["full_resume_error"]
        assert case["progress"] == {"consumed_train_samples": 4, "step": 1}
        assert case["weights_only_logps_diff"] < LOGIT_TOL


def test_lora_under_tp2_trains_like_peft_and_exports_a_peft_adapter(two_ranks):
    for rank in two_ranks:
        case = rank["lora"]
        # the same initial adapter, trained by peft on the HF model: the same losses
        assert case["losses"] == pytest.approx(case["reference_losses"], abs=LOSS_TOL)
        assert case["losses"][-1] < case["losses"][0]
        assert case["trained_change"] > 0.1
        assert case["base_frozen"] is True
        assert "adapters: default" in case["configs"]
        assert case["progress"] == {"consumed_train_samples": 8, "step": 3}
        assert case["resumed_logps_equal"] is True
    first = two_ranks[0]["lora"]
    assert first["peft_logps_diff"] < LOGIT_TOL  # PeftModel on the HF model reproduces it
    assert first["merged_logps_diff"] < LOGIT_TOL  # and so does the merged export
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(first["adapter_files"])


# ---- four processes -----------------------------------------------------------------------


@pytest.mark.parametrize("case", ["tp2pp2", "pp2ep2"])
def test_four_rank_layouts_match_transformers_model(four_ranks, case):
    for rank in four_ranks:
        _check_equivalence(rank[case])
    assert four_ranks[0][case]["export_exact"] is True
