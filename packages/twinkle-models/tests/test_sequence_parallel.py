"""Ulysses sequence parallel: SP(2) under torchrun (gloo, CPU) against one process.

One torchrun launch runs every case of scripts/sp_equivalence.py. Tolerances (float32):
losses to 1e-6 relative; first-step gradients to 1e-6 absolute (measured: <= 5e-8);
parameters after 3 SGD steps to 1e-5, after 3 AdamW steps through TransformersModel to
1e-5 (measured: <= 2e-6); the MoE with its router aux loss through TransformersModel, 3 SGD
steps, to 1e-5. With no processor set (padding-free by default) each batch runs as one
packed row split over the SP ranks, against one process training the same batches padded.
"""

import json
import re
from pathlib import Path

import pytest
import torch

from twinkle.mesh import DeviceMesh
from twinkle.model.transformers.strategy.sequence_parallel import (
    SequenceParallel,
    SequenceParallelConfig,
    SequenceParallelStrategy,
    sequence_parallel_of,
)

SCRIPT = Path(__file__).parent / "scripts" / "sp_equivalence.py"
FUNCTION_CASES = ("padded", "padded_eager", "packed", "qwen3_5", "qwen3_5_packed", "moe")
MODEL_CASES = ("model_full_padded", "model_lora_packed")


@pytest.fixture(scope="module")
def results(tmp_path_factory, torchrun) -> list[dict]:
    out = tmp_path_factory.mktemp("sp")
    torchrun(SCRIPT, out)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("case", FUNCTION_CASES)
def test_sp_matches_one_process(results, case):
    for rank in results:
        got = rank[case]
        assert got["losses_sp"] == pytest.approx(got["losses_ref"], rel=1e-6)
        assert got["max_grad_diff"] < 1e-6
        assert got["max_param_diff"] < 1e-5
    # The steps changed the model: equal losses are not three copies of the first one.
    assert len(set(results[0][case]["losses_ref"])) == 3


@pytest.mark.parametrize("case", MODEL_CASES)
def test_transformers_model_under_sp_matches_one_process(results, case):
    for rank in results:
        assert rank[case]["losses_sp"] == pytest.approx(rank[case]["losses_ref"], rel=1e-6)
        assert rank[case]["strategy"] == "SequenceParallelStrategy"
    assert results[0][case]["weights_compared"] > 0
    assert results[0][case]["max_param_diff"] < 1e-5


ROW_LENGTHS = [(7 + step, 12, 5) for step in range(3)]  # sp_equivalence.feature_batches


@pytest.mark.parametrize("case", ("model_full_default", "model_lora_default"))
def test_the_default_runs_packed_under_sp_and_equals_one_process_padded(results, case):
    """No processor set: each batch runs as one packed row split over the SP ranks. The
    losses' bound (1e-5 relative; measured equal) and the weights' after 3 AdamW steps
    (1e-4; measured 4.6e-6 full, 2.5e-6 LoRA) still catch a packed sequence attending to
    the one before it or a label at a sequence start (step-one loss off by > 1e-3, weights
    by ~lr = 1e-3)."""
    halves = [[1, (sum(row) + 1) // 2] for row in ROW_LENGTHS]
    for rank in results:
        got = rank[case]
        assert got["shapes"] == halves
        assert got["losses_sp"] == pytest.approx(got["losses_ref"], rel=1e-5)
    assert results[0][case]["weights_compared"] > 0
    assert results[0][case]["max_param_diff"] < 1e-4


def test_a_forward_without_labels_stays_padded_under_sp(results):
    """Its logits may stay per shard (gather_logits=False), so they keep the padded rows."""
    for rank in results:
        got = rank["unlabelled_default"]
        assert got["shapes"] == [[3, 6]] and got["shape"][:2] == [3, 12]
        assert got["max_diff"] < 1e-5


def test_forward_without_labels_returns_full_logits(results):
    assert [rank["logits_diff"] for rank in results] == [0.0, 0.0]


def test_heads_not_divisible_without_a_ring_fallback_fail_at_setup(results):
    """Qwen3.5 with one key/value head: Ulysses cannot split it and ring attention (its
    fallback, tested in test_context_parallel) does not run linear-attention layers."""
    for rank in results:
        message = rank["bad_kv_heads"]
        assert "ulysses_size=2 must divide the model's num_key_value_heads=1" in message
        assert "ring attention, does not run this model" in message
        assert "['linear_attention']" in message


def test_moe_aux_loss_under_sp_matches_one_process(results):
    """The router load-balancing loss sees the whole sequence and its gradient counts once:
    counted on both SP ranks it would move the weights as a doubled coefficient does."""
    for rank in results:
        got = rank["model_moe_aux"]
        assert got["losses_sp"] == pytest.approx(got["losses_ref"], rel=1e-6)
    got = results[0]["model_moe_aux"]
    assert got["weights_compared"] > 0
    assert got["max_param_diff"] < 1e-5
    assert got["doubled_aux_param_diff"] > 100 * max(got["max_param_diff"], 1e-7)


def tiny_model():
    from transformers import AutoConfig, AutoModelForCausalLM

    from twinkle.hub import resolve_model

    config = AutoConfig.from_pretrained(resolve_model("bundled://tiny-qwen3"))
    return AutoModelForCausalLM.from_config(config)


def test_config_ulysses_size_must_match_the_mesh():
    mesh = DeviceMesh.from_sizes(world_size=2, ulysses_size=2, device_type="cpu")
    with pytest.raises(ValueError, match=r"ulysses_size=4\) differs from the DeviceMesh's"):
        SequenceParallelStrategy(mesh, SequenceParallelConfig(ulysses_size=4))


def test_sp_needs_torch_distributed():
    assert not torch.distributed.is_initialized()
    mesh = DeviceMesh.from_sizes(world_size=2, ulysses_size=2, device_type="cpu")
    with pytest.raises(RuntimeError, match="needs torch.distributed: launch with torchrun"):
        SequenceParallelStrategy(mesh).apply(tiny_model())


def test_the_pages_three_names_are_the_config_the_strategy_and_the_core():
    """The SP page lists SequenceParallelConfig, SequenceParallelStrategy and
    SequenceParallel; the strategy checks the config against the mesh and is not applied
    until apply(model) (torchrun: scripts/sp_equivalence.py)."""
    mesh = DeviceMesh.from_sizes(world_size=8, dp_size=2, ulysses_size=4, device_type="cpu")
    config = SequenceParallelConfig(enabled=True, ulysses_size=None, gather_logits=True)
    strategy = SequenceParallelStrategy(mesh, config)
    assert (strategy.size, strategy.active, strategy.config) == (4, True, config)
    assert isinstance(SequenceParallel, type)
    with pytest.raises(RuntimeError, match=r"apply\(model\) has not run yet"):
        strategy.shard({"input_ids": torch.zeros(1, 4, dtype=torch.long)})


def test_disabled_or_size_one_is_a_no_op():
    model = tiny_model()
    mesh = DeviceMesh.from_sizes(world_size=2, ulysses_size=2, device_type="cpu")
    off = SequenceParallelConfig(enabled=False)
    assert SequenceParallelStrategy(mesh, off).apply(model) is None
    assert SequenceParallelStrategy(DeviceMesh.from_sizes(device_type="cpu")).apply(model) is None
    assert sequence_parallel_of(model) is None
    assert model.config._attn_implementation == "sdpa"


def first_rows_tokens(rows: int) -> int:
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.preprocessor import SelfCognitionProcessor

    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition"))
    dataset.set_template("Qwen3_5Template", model_id="bundled://tiny-qwen3")
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    return sum(len(dataset[i]["input_ids"]) for i in range(rows))


def test_the_sp_cookbook_trains_and_counts_each_batch_once(tmp_path, torchrun):
    script = Path(__file__).resolve().parents[3] / "cookbook" / "torchrun" / "sp.py"
    done = torchrun(script, env={"TWINKLE_MAX_STEPS": "2"}, cwd=tmp_path)
    metric = re.search(
        r"step 0 of \d+, metric: \{'loss': ([0-9.]+).*'tokens': ([0-9.]+)", done.stderr
    )
    assert metric is not None, done.stderr[-3000:]
    assert 7.0 < float(metric.group(1)) < 9.0
    # Both Ulysses peers read the same 4 rows; the metrics count them once.
    assert float(metric.group(2)) == first_rows_tokens(4)
