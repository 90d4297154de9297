"""Context parallel (ring attention) against one process, run by test_context_parallel.

    torchrun --nproc_per_node=2 cp_equivalence.py cp2 OUT
    torchrun --nproc_per_node=4 cp_equivalence.py cp2_fsdp2 OUT

cp2 (2 ranks): plain Hugging Face models first (sp_equivalence's harness: a reference trained
on the whole batch in this process and a copy trained on this rank's zigzag chunks, its
gradients summed over the group, SGD): the bundled Qwen3 on padded batches of odd-length rows
and on packed rows; Ulysses with ulysses_size=2 on a model with one key/value head, which
falls back to ring attention; a forward without labels (gathered logits); a row shorter than
2 × cp blocks. Then TransformersModel with DeviceMesh(cp_size=2): full training on padded
batches and LoRA with activation checkpointing (the ring runs again in the backward) on
packed ones, AdamW and clipping, against TransformersModel without a mesh; and both with no
processor set (padding-free by default: cp runs each batch as one packed row) against one
process training the same batches padded.

cp2_fsdp2 (4 ranks): the same two TransformersModel runs with fsdp_size=2 × cp_size=2, each
fsdp rank reading its share of the global batch (uneven: 2 rows and 1). Results go to
OUT/<mode>_rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig
from sp_equivalence import (
    batches,
    build,
    max_diff,
    reference_step,
    rows_seen,
    sp_step,
    tiny_config,
)
from sp_equivalence import feature_batches as sp_feature_batches

from twinkle.mesh import DeviceMesh
from twinkle.model import TransformersModel
from twinkle.model.transformers.strategy.context_parallel import ContextParallelStrategy
from twinkle.model.transformers.strategy.sequence_parallel import (
    SequenceParallelStrategy,
    sequence_parallel_of,
)
from twinkle.model.transformers.strategy.state_dict import full_model_state_dict
from twinkle.processor import InputProcessor

LR = 0.5


def function_case(strategy, config, packed: bool) -> dict:
    """sp_equivalence.run_case for any splitting strategy and model config."""
    reference, parallel = build(config), build(config)
    applied = strategy.apply(parallel)
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in (reference, parallel)]
    losses_ref, losses_cp, grad_diff = [], [], None
    for batch in batches(config.vocab_size, packed):
        loss = reference_step(reference, batch)
        loss.backward()
        losses_ref.append(float(loss.detach()))
        losses_cp.append(float(sp_step(parallel, applied, batch)))
        if grad_diff is None:
            grad_diff = max_diff(reference, parallel, lambda p: p.grad)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    return {
        "losses_ref": losses_ref,
        "losses_cp": losses_cp,
        "max_grad_diff": grad_diff,
        "max_param_diff": max_diff(reference, parallel, lambda p: p.detach()),
        "core": type(applied._core).__name__,
        "attention": parallel.config._attn_implementation,
    }


def gathered_logits(mesh: DeviceMesh) -> float:
    """The largest logit difference on real tokens (a padding position's logits are never
    read; its query sees other keys than under transformers' mask)."""
    config = tiny_config("qwen3")
    reference, parallel = build(config), build(config)
    cp = ContextParallelStrategy(mesh).apply(parallel)
    batch = batches(config.vocab_size, packed=False)[0]
    batch.pop("labels")
    with torch.no_grad():
        expected = reference(**batch, use_cache=False).logits
        inputs, shard = cp.shard(batch)
        got = shard.outputs(parallel(**inputs, use_cache=False).logits)["logits"]
    real = batch["attention_mask"].bool()
    return float((expected - got).abs()[real].max())


def short_row(mesh: DeviceMesh) -> str:
    cp = ContextParallelStrategy(mesh).apply(build(tiny_config("qwen3")))
    try:
        cp.shard({"input_ids": torch.ones(2, 3, dtype=torch.long)})
    except ValueError as exc:
        return str(exc)
    return ""


def my_share(batch: list, mesh: DeviceMesh | None) -> list:
    return batch if mesh is None else batch[mesh.get_slice(len(batch))]


def train_model(mesh: DeviceMesh | None, lora: bool, packed: bool | None) -> dict:
    """``packed`` None: the processor leaves the choice to the model (padding-free by
    default)."""
    torch.manual_seed(0)  # the LoRA init draws from the global generator
    model = TransformersModel(
        "bundled://tiny-qwen3", device="cpu", device_mesh=mesh, gradient_checkpointing=lora
    )
    if lora:
        model.add_adapter_to_model("default", LoraConfig(r=4, target_modules="all-linear"))
    if packed is not None:
        model.set_processor(InputProcessor, padding_free=packed)
    model.set_optimizer("AdamW", lr=1e-2 if lora else 1e-3)
    losses, norms, shapes = [], [], rows_seen(model)
    for features in sp_feature_batches(model.model.config.vocab_size):
        model.forward_backward(my_share(features, mesh))
        model.clip_grad_and_step(1.0)
        metric = model.calculate_metric()  # the global batch's, on every rank
        losses.append(metric["loss"])
        norms.append(metric["grad_norm"])
    names = {n for n, p in model.model.named_parameters() if p.requires_grad}
    state = full_model_state_dict(model.model)
    strategy = type(sequence_parallel_of(model.model)).__name__
    return {
        "losses": losses,
        "grad_norms": norms,
        "weights": {n: state[n].float() for n in names if n in state},
        "strategy": strategy,
        "shapes": shapes,
    }


def model_case(
    mesh: DeviceMesh, lora: bool, packed: bool | None, reference_packed: bool | None = None
) -> dict:
    """cp against one process; ``reference_packed`` sets the one process's processor apart
    (default: the same as the cp run's)."""
    reference = train_model(None, lora, packed if reference_packed is None else reference_packed)
    parallel = train_model(mesh, lora, packed)
    diffs = [(reference["weights"][n] - w).abs().max() for n, w in parallel["weights"].items()]
    return {
        "losses_ref": reference["losses"],
        "losses_cp": parallel["losses"],
        "grad_norms_ref": reference["grad_norms"],
        "grad_norms_cp": parallel["grad_norms"],
        "strategy": parallel["strategy"],
        "shapes": parallel["shapes"],
        "weights_compared": len(diffs),  # rank 0 gathers the weights; the others get none
        "max_param_diff": float(max(diffs)) if diffs else None,
    }


def main(mode: str, out: Path) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    if mode == "cp2":
        mesh = DeviceMesh.from_sizes(cp_size=2, device_type="cpu")
        one_kv_head = tiny_config("qwen3")
        one_kv_head.num_key_value_heads = 1
        ulysses = DeviceMesh.from_sizes(world_size=2, ulysses_size=2, device_type="cpu")
        result = {
            "padded": function_case(ContextParallelStrategy(mesh), tiny_config("qwen3"), False),
            "packed": function_case(ContextParallelStrategy(mesh), tiny_config("qwen3"), True),
            "ulysses_fallback": function_case(
                SequenceParallelStrategy(ulysses), one_kv_head, packed=False
            ),
            "logits_diff": gathered_logits(mesh),
            "short_row": short_row(mesh),
        }
    else:
        mesh = DeviceMesh.from_sizes(fsdp_size=2, cp_size=2, device_type="cpu")
        result = {}
    result["model_full_padded"] = model_case(mesh, lora=False, packed=False)
    result["model_lora_packed"] = model_case(mesh, lora=True, packed=True)
    if mode == "cp2":
        # The documents' loop sets no processor: cp packs each batch's padding away, and
        # equals one process training padded batches.
        result["model_full_default"] = model_case(mesh, False, None, reference_packed=False)
        result["model_lora_default"] = model_case(mesh, True, None, reference_packed=False)
    (out / f"{mode}_rank{dist.get_rank()}.json").write_text(json.dumps(result))
    # NOTE: gloo's teardown can abort a rank whose peer closed first (sp_equivalence).
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
