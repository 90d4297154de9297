"""Context parallel (ring attention) under torchrun (gloo, CPU) against one process.

Two launches of scripts/cp_equivalence.py: cp2 (2 ranks: plain models, the Ulysses fallback,
TransformersModel with cp_size=2) and cp2_fsdp2 (4 ranks: TransformersModel with
fsdp_size=2 × cp_size=2, uneven data shares). Tolerances (float32): losses to 1e-6 relative;
first-step gradients to 1e-6 absolute and parameters after 3 SGD steps to 1e-5 (measured:
<= 1.7e-7 and 7e-7); through TransformersModel, LoRA weights after 3 AdamW steps to 1e-5
(measured: <= 3.5e-6) and full weights to 5e-5 (measured: 1.0e-5: Adam divides by each
gradient's own size, so float32 noise on tiny gradients moves weights by up to lr × noise
ratio; the expert-parallel tests hold AdamW weights to 1e-4 for the same reason).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from twinkle.mesh import DeviceMesh
from twinkle.model.transformers.strategy.context_parallel import ContextParallelStrategy
from twinkle.model.transformers.strategy.parallelize import check_mesh
from twinkle.model.transformers.strategy.ring_attention import ring_attention

SCRIPT = Path(__file__).parent / "scripts" / "cp_equivalence.py"
FUNCTION_CASES = ("padded", "packed", "ulysses_fallback")
MODEL_CASES = {"model_full_padded": 5e-5, "model_lora_packed": 1e-5}
DEFAULT_CASES = {"model_full_default": 1e-4, "model_lora_default": 1e-4}


@pytest.fixture(scope="module")
def cp2(tmp_path_factory, torchrun) -> list[dict]:
    out = tmp_path_factory.mktemp("cp2")
    torchrun(SCRIPT, "cp2", out, timeout=400)
    return [json.loads((out / f"cp2_rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def cp2_fsdp2(tmp_path_factory, torchrun) -> list[dict]:
    out = tmp_path_factory.mktemp("cp2_fsdp2")
    torchrun(SCRIPT, "cp2_fsdp2", out, procs=4, timeout=400)
    return [json.loads((out / f"cp2_fsdp2_rank{r}.json").read_text()) for r in range(4)]


@pytest.mark.parametrize("case", FUNCTION_CASES)
def test_ring_attention_trains_like_one_process(cp2, case):
    for rank in cp2:
        got = rank[case]
        assert got["losses_cp"] == pytest.approx(got["losses_ref"], rel=1e-6)
        assert got["max_grad_diff"] < 1e-6
        assert got["max_param_diff"] < 1e-5
        assert (got["core"], got["attention"]) == ("ContextParallel", "twinkle_ring_attention")
    # The steps changed the model: equal losses are not three copies of the first one.
    assert len(set(cp2[0][case]["losses_ref"])) == 3


def assert_model_case(
    ranks: list[dict], case: str, bound: float | None = None, loss_rel: float = 1e-6
) -> None:
    for rank in ranks:
        got = rank[case]
        assert got["losses_cp"] == pytest.approx(got["losses_ref"], rel=loss_rel)
        assert got["grad_norms_cp"] == pytest.approx(got["grad_norms_ref"], rel=1e-4)
        assert got["strategy"] == "ContextParallelStrategy"
    assert ranks[0][case]["weights_compared"] > 0
    assert ranks[0][case]["max_param_diff"] < (bound or MODEL_CASES[case])


@pytest.mark.parametrize("case", MODEL_CASES)
def test_transformers_model_with_cp_size_2_matches_one_process(cp2, case):
    assert_model_case(cp2, case)


@pytest.mark.parametrize("case", MODEL_CASES)
def test_cp2_times_fsdp2_matches_one_process(cp2_fsdp2, case):
    assert_model_case(cp2_fsdp2, case)


ROW_LENGTHS = [(7 + step, 12, 5) for step in range(3)]  # sp_equivalence.feature_batches


@pytest.mark.parametrize("case", ("model_full_default", "model_lora_default"))
def test_the_default_runs_packed_under_cp_and_equals_one_process_padded(cp2, case):
    """No processor set: each batch runs as one packed row, each rank its zigzag chunks of
    it (the row padded to 2 × cp blocks). Bounds: losses 1e-5 relative (measured equal),
    grad norms 1e-4 (measured 1.1e-7), weights after 3 AdamW steps 1e-4 (measured 2.5e-6,
    full and LoRA); a packed sequence attending to the one before it moves the step-one
    loss by > 1e-3 and the weights by ~lr = 1e-3."""
    chunks = [[1, -(-sum(row) // 4) * 2] for row in ROW_LENGTHS]
    for rank in cp2:
        assert rank[case]["shapes"] == chunks
    assert_model_case(cp2, case, bound=DEFAULT_CASES[case], loss_rel=1e-5)


def test_forward_without_labels_returns_the_real_tokens_logits(cp2):
    assert all(rank["logits_diff"] < 1e-5 for rank in cp2)


def test_a_row_shorter_than_two_blocks_per_rank_is_refused(cp2):
    for rank in cp2:
        assert "cuts each row into 2 × 2 = 4 blocks" in rank["short_row"]
        assert "rows have 3 tokens" in rank["short_row"]


@pytest.mark.parametrize(
    ("sizes", "named"),
    [
        ({"cp_size": 2, "tp_size": 2, "fsdp_size": 2}, "tp_size"),
        ({"cp_size": 2, "dp_size": 2, "ulysses_size": 2}, "ulysses_size"),
        ({"cp_size": 2, "fsdp_size": 2, "ep_size": 2}, "ep_size"),
        ({"cp_size": 2, "pp_size": 2}, "pp_size"),  # the stages run no ring attention
    ],
)
def test_cp_with_pp_tp_ulysses_or_ep_is_refused_at_setup(sizes, named):
    with pytest.raises(
        ValueError, match=f"context parallel combines with dp and fsdp, not with {named}"
    ):
        check_mesh(DeviceMesh.from_sizes(**sizes, device_type="cpu"))


def test_cp_needs_torch_distributed():
    from transformers import AutoConfig, AutoModelForCausalLM

    from twinkle.hub import resolve_model

    config = AutoConfig.from_pretrained(resolve_model("bundled://tiny-qwen3"))
    mesh = DeviceMesh.from_sizes(cp_size=2, device_type="cpu")
    strategy = ContextParallelStrategy(mesh)
    assert (strategy.size, strategy.active) == (2, True)
    with pytest.raises(RuntimeError, match="context parallel needs torch.distributed: launch"):
        strategy.apply(AutoModelForCausalLM.from_config(config))


def test_ring_attention_outside_a_cp_forward_says_how_to_run_it():
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="through ContextParallel.shard"):
        ring_attention(None, q, q, q, None)
