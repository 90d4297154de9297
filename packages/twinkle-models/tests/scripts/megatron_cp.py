"""Run under torchrun (CPU, gloo): MegatronModel with context parallel against one-process
TransformersModel.

Usage: torchrun --nproc_per_node=N megatron_cp.py OUT_DIR CASE [CASE ...], where a CASE is
``cp2`` (the tiny Qwen3; with it a packed batch and GRPO steps), ``cp2moe`` (a tiny
Qwen3-MoE), ``cp2lora`` (LoRA under cp2, checked against peft), or on 4 ranks ``tp2cp2``
(with sequence parallel), ``pp2cp2``, ``vpp2cp2`` (pp2 × vpp2 × cp2 on a 4-layer model),
``dp2cp2`` and ``dp2cp2ep2`` (the MoE). Each rank writes ``OUT_DIR/rank<r>.json`` with,
per case, the figures the test asserts on; Megatron's parallel state is torn down between
cases.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from twinkle import DeviceMesh
from twinkle.model import MegatronModel, TransformersModel
from twinkle.model.megatron.cpu_mode import cpu_mode
from twinkle.processor import InputProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_parallel import (  # noqa: E402
    MODEL,
    compare_training,
    features,
    four_layer_config,
    lora_case,
    max_diff,
    moe_config,
)

SIZES = {
    "cp2": {"cp_size": 2},
    "cp2moe": {"cp_size": 2},
    "tp2cp2": {"tp_size": 2, "cp_size": 2, "sequence_parallel": True},
    "pp2cp2": {"pp_size": 2, "cp_size": 2},
    "vpp2cp2": {"pp_size": 2, "vpp_size": 2, "cp_size": 2},
    "dp2cp2": {"dp_size": 2, "cp_size": 2},
    "dp2cp2ep2": {"dp_size": 2, "cp_size": 2, "ep_size": 2},
}


def full_logits(model, batch: dict) -> torch.Tensor:
    """Logits of the whole sequence: each cp rank's chunks, vocabulary gathered over tp,
    chunks gathered over cp."""
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from twinkle.model.megatron.context_parallel import gather_sequence, split_sequence

    chunk = model.chunks[0]
    chunk.eval()
    with torch.no_grad(), cpu_mode():  # the chunk itself, outside MegatronModel's methods
        local = chunk(split_sequence(batch["input_ids"]), None, None)
        local = gather_from_tensor_model_parallel_region(local)[..., : model.spec.vocab_size]
        return gather_sequence(local.contiguous())


def equivalence(case: str, feats: list) -> dict:
    config = None
    if "moe" in case or "ep" in case:
        config = moe_config(renormalise=True)
    elif "vpp" in case:
        config = four_layer_config()
    model_id = None if config is not None else MODEL
    mesh = DeviceMesh.from_sizes(device_type="cpu", **SIZES[case])
    model = MegatronModel(model_id, config=config, device_mesh=mesh, device="cpu")
    reference = TransformersModel(model_id, config=config, device="cpu")
    out = {"cp": parallel_state.get_context_parallel_world_size()}
    mine, ref = model.forward_only(feats), reference.forward_only(feats)
    out["logps_max_diff"] = max_diff(mine.logps, ref.logps)
    out["logps_shape_equal"] = tuple(mine.logps.shape) == tuple(ref.logps.shape)
    out["loss_diff"] = abs(mine.loss - ref.loss)
    if case == "cp2":
        out.update(packed_logps(model, reference, feats))
    batch, _, _ = model._collate(feats, model._state(None), {})
    out["padded_length"] = batch["input_ids"].shape[1]
    if parallel_state.get_pipeline_model_parallel_world_size() == 1:
        with torch.no_grad():
            hf = reference.model(input_ids=batch["input_ids"]).logits
        out["logits_max_diff"] = max_diff(full_logits(model, batch), hf)
    model.set_optimizer("AdamW", lr=1e-3)
    reference.set_optimizer("AdamW", lr=1e-3)
    out.update(compare_training(model, reference, feats, mesh))
    out["metrics"] = model.calculate_metric()
    out["reference_metrics"] = reference.calculate_metric()
    if case == "cp2":
        out.update(grpo_steps(model, reference, feats))
    return out


def grpo_steps(model, reference, feats: list) -> dict:
    """Two GRPO steps in two micro-batches (per-sequence advantages, per-token old logps):
    the same losses and gradient norms as the one-process reference."""
    out = {"grpo_losses": [], "grpo_reference_losses": [], "grpo_grad_norms": []}
    for name, runner in (("megatron", model), ("reference", reference)):
        old_logps = runner.forward_only(feats).logps
        runner.set_loss("GRPOLoss", epsilon=0.2)
        advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
        kwargs = {"micro_batch_size": 2} if name == "megatron" else {}
        for _ in range(2):
            loss = runner.forward_backward(
                feats, old_logps=old_logps, advantages=advantages, **kwargs
            ).loss
            norm = runner.clip_grad_and_step(1.0)
            key = "grpo_losses" if name == "megatron" else "grpo_reference_losses"
            out[key].append(float(loss))
            out["grpo_grad_norms"].append(float(norm))
        runner.set_loss("CrossEntropyLoss")
    return out


def packed_logps(model, reference, feats: list) -> dict:
    """A packed (padding-free) batch: the reference's per-token logps, in the packed layout."""
    packed = InputProcessor(padding_free=True)(feats)
    mine, ref = model.forward_only(packed), reference.forward_only(packed)
    return {
        "packed_logps_shape_equal": tuple(mine.logps.shape) == tuple(ref.logps.shape),
        "packed_logps_max_diff": max_diff(mine.logps, ref.logps),
        "packed_loss_diff": abs(mine.loss - ref.loss),
    }


def main() -> None:
    out_dir, cases = Path(sys.argv[1]), sys.argv[2:]
    feats = features()
    results = {}
    for case in cases:
        if case == "cp2lora":
            results[case] = lora_case(feats, out_dir / "lora", sizes={"cp_size": 2})
        else:
            results[case] = equivalence(case, feats)
        parallel_state.destroy_model_parallel()
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    # NOTE: gloo's C++ teardown can abort a rank ("terminate called without an active
    # exception") when its peer closes the sockets first, even after a barrier. Every rank has
    # written its results, so it leaves without running the destructors.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
