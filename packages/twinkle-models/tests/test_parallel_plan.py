"""The strategy functions in one process: which plan a mesh gets, the mesh checks, the mixed
precision policy and the global-norm clipping (against torch's own)."""

import pytest
import torch

from twinkle import DeviceMesh
from twinkle.model import TransformersModel
from twinkle.model.transformers.strategy import check_mesh, parallelize
from twinkle.model.transformers.strategy.fsdp import decoder_layers, mixed_precision_policy
from twinkle.model.transformers.strategy.grads import clip_grad_norm

MODEL_ID = "bundled://tiny-qwen3"


def test_a_mesh_sized_for_more_processes_than_run_is_refused_with_the_launch_command():
    model = TransformersModel(
        MODEL_ID,
        device="cpu",
        device_mesh=DeviceMesh.from_sizes(fsdp_size=2, dp_size=2, device_type="cpu"),
    )
    with pytest.raises(ValueError, match=r"world_size 4 \(dp=2 × fsdp=2\).*--nproc_per_node=4"):
        model.set_optimizer("AdamW")


@pytest.mark.parametrize(
    ("sizes", "named"),
    [
        ({"pp_size": 2, "dp_size": 2, "ulysses_size": 2}, "ulysses_size"),
        ({"pp_size": 2, "dp_size": 2, "ep_size": 2}, "ep_size"),
        ({"pp_size": 2, "tp_size": 2, "dp_size": 2, "ep_size": 2}, "ep_size"),
    ],
)
def test_pipeline_parallel_with_ulysses_or_ep_is_refused(sizes, named):
    """Pipeline parallel runs on TransformersModel over dp, fsdp and tp
    (test_pipeline_parallel); with the sequence or expert dimensions not yet."""
    documents = DeviceMesh.from_sizes(pp_size=2, tp_size=2, dp_size=2, device_type="cpu")
    with pytest.raises(ValueError, match="world_size 8 .* torch.distributed is not started"):
        check_mesh(documents)  # past the dimensions: refused only for the processes
    with pytest.raises(
        ValueError, match=f"pipeline parallel combines with dp, fsdp and tp, not with {named}"
    ):
        check_mesh(DeviceMesh.from_sizes(**sizes, device_type="cpu"))


def test_one_process_gets_a_plan_that_wraps_nothing_and_enables_checkpointing():
    model = TransformersModel(MODEL_ID, device="cpu").model
    plan = parallelize(
        model, DeviceMesh.from_sizes(dp_size=1, device_type="cpu"), gradient_checkpointing=True
    )
    assert plan.kind == "single" and not plan.distributed and plan.gradient_ranks == 1
    assert model.is_activation_checkpointing
    assert plan.run("unit", lambda x: x + 1, 1) == 2
    assert plan.all_reduce_sum(3.5) == 3.5
    assert len(decoder_layers(model)) == model.config.num_hidden_layers


def test_one_process_plan_runs_batches_whole_and_counts_tokens_as_they_are():
    """The hooks the training step asks: without Ulysses, batches and counts stay as they are."""
    model = TransformersModel(MODEL_ID, device="cpu").model
    plan = parallelize(model, DeviceMesh.from_sizes(dp_size=1, device_type="cpu"))
    batch = {"input_ids": torch.ones(2, 5, dtype=torch.long)}
    assert plan.prepare_batch(batch) is None and not plan.splits_sequences
    router_logits = [torch.randn(10, 4)]
    assert plan.finish_router_logits(None, router_logits) is router_logits
    assert plan.reports_metrics
    assert plan.global_tokens(7.0) == 7.0 and plan.tokens_per_rank() == 1.0


def test_mixed_precision_policy_computes_low_and_reduces_in_float32():
    bf16 = mixed_precision_policy("bf16")
    assert bf16.param_dtype == torch.bfloat16 and bf16.reduce_dtype == torch.float32
    assert mixed_precision_policy("fp32").param_dtype is None


def test_clipping_matches_torch_on_plain_gradients():
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for a, b in zip(ours, theirs, strict=True):
        a.grad = torch.randn_like(a)
        b.grad = a.grad.clone()
    norm = clip_grad_norm(ours, 1.0)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert norm == pytest.approx(float(expected), rel=1e-6) and norm > 1.0
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
