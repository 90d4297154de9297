"""Train the bundled tiny model under each strategy named; test_parallel_strategies compares the
results with a single-process run of the same functions. One launch runs every strategy of
its size, as a launch's imports cost more than a case:

    torchrun --nproc_per_node=2 parallel_train.py OUT ddp fsdp tp  # dp=2, fsdp=2, tp=2
    torchrun --nproc_per_node=4 parallel_train.py OUT hsdp fsdp_tp # dp=2 x fsdp=2, fsdp=2 x tp=2

fsdp and tp also save and resume checkpoints (under OUT/<strategy>/).

Every case reads the same global batches; each rank takes its data rank's slice, and the
slices hold very different token counts (short answers first, long ones last). Rank 0
writes OUT/<strategy>.pt (losses, metrics, gathered weights and gradients) and
OUT/<strategy>.json (the error messages of the bad-input cases).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig
from torch.distributed.tensor import DTensor

import twinkle
from twinkle import DeviceMesh
from twinkle.model import TransformersModel
from twinkle.model.transformers.strategy.state_dict import full_model_state_dict
from twinkle.template import build_template

MODEL_ID = "bundled://tiny-qwen3"
STEPS, CALLS_PER_STEP, ROWS_PER_CALL = 3, 2, 4
MAX_GRAD_NORM = 0.5  # small enough that every step clips: the global norm must be right
MESHES = {
    "ddp": {"dp_size": 2},
    "fsdp": {"fsdp_size": 2},
    "hsdp": {"dp_size": 2, "fsdp_size": 2},
    "tp": {"tp_size": 2},
    "fsdp_tp": {"fsdp_size": 2, "tp_size": 2},
}


def global_batches() -> list[list]:
    """CALLS_PER_STEP global batches of ROWS_PER_CALL conversations; the second half of each
    has answers about ten times longer, so data ranks see uneven token counts."""
    template = build_template("Qwen3_5Template", model_id=MODEL_ID, max_length=512)
    rows = []
    for i in range(CALLS_PER_STEP * ROWS_PER_CALL):
        long = i % ROWS_PER_CALL >= ROWS_PER_CALL // 2
        answer = f"I am Twinkle number {i}." + (" I was trained to help." * 10 if long else "")
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": f"Question {i}: who are you?"},
                    {"role": "assistant", "content": answer},
                ]
            }
        )
    features = template.batch_encode(rows)
    n = ROWS_PER_CALL
    return [features[i * n : (i + 1) * n] for i in range(CALLS_PER_STEP)]


def my_share(batch: list, mesh: DeviceMesh | None) -> list:
    return batch if mesh is None else batch[mesh.get_slice(len(batch))]


def build(
    kind: str, mesh: DeviceMesh | None, accumulation: int = CALLS_PER_STEP
) -> TransformersModel:
    torch.manual_seed(0)  # the LoRA init draws from the global generator: same in the reference
    model = TransformersModel(MODEL_ID, device="cpu", device_mesh=mesh)
    if kind == "lora":
        config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
        model.add_adapter_to_model("default", config, gradient_accumulation_steps=accumulation)
        model.set_optimizer("AdamW", lr=1e-2)
    else:
        model.set_optimizer("AdamW", lr=1e-3)
    return model


def gathered(model: TransformersModel, what: str) -> dict[str, torch.Tensor]:
    """Trainable parameters (on rank 0; {} elsewhere) or their gradients (on every rank) as
    whole CPU tensors."""
    names = {n for n, p in model.model.named_parameters() if p.requires_grad}
    if what == "weights":
        state = full_model_state_dict(model.model)
        return {n: state[n].float().clone() for n in sorted(names) if state}
    grads = {}
    for name, param in model.model.named_parameters():
        if name in names and param.grad is not None:
            grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
            grads[name] = grad.detach().float().cpu().clone()
    return grads


def first_gradient(kind: str, mesh: DeviceMesh | None) -> dict:
    """One forward_backward on the first global batch, normalised (clip with no effect): the
    gradient must equal the single-process one however the tokens split across ranks."""
    model = build(kind, mesh, accumulation=1)
    batches = global_batches()
    model.forward_backward(my_share(batches[0], mesh), micro_batch_size=1)
    norm = model.clip_grad_norm(1e9)
    return {"grad_norm": norm, "grads": gathered(model, "grads")}


def train(kind: str, mesh: DeviceMesh | None, model: TransformersModel | None = None) -> dict:
    """STEPS optimizer steps of CALLS_PER_STEP calls on the same global batches; LoRA
    accumulates over calls (gradient_accumulation_steps), full training over micro-batches."""
    model = model or build(kind, mesh)
    batches = global_batches()
    losses, metrics = [], []
    for _ in range(STEPS):
        for batch in batches if kind == "lora" else [sum(batches, [])]:
            model.forward_backward(my_share(batch, mesh), micro_batch_size=2)
            model.clip_grad_and_step(MAX_GRAD_NORM)
        metrics.append(model.calculate_metric())
        losses.append(metrics[-1]["loss"])
    return {"losses": losses, "metrics": metrics, "weights": gathered(model, "weights")}


def accumulation_is_local(mesh: DeviceMesh) -> dict[str, bool]:
    """The first of two accumulated backwards reduces nothing (DDP's gradients still differ
    across ranks; FSDP2 has produced no sharded gradient yet); the second reduces them."""
    model = build("lora", mesh)
    batches = global_batches()

    def reduced() -> bool:
        params = {n: p for n, p in model.model.named_parameters() if p.requires_grad}
        if any(p.grad is None for p in params.values()):
            return False
        # lora_B: lora_A's gradient is zero on every rank while lora_B is still zero.
        grad = next(p.grad for n, p in params.items() if "lora_B" in n)
        local = (grad.to_local() if isinstance(grad, DTensor) else grad).flatten()
        copies = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, local.contiguous())
        return isinstance(grad, DTensor) or all(torch.equal(c, copies[0]) for c in copies)

    model.forward_backward(my_share(batches[0], mesh))
    first = reduced()
    model.clip_grad_and_step(MAX_GRAD_NORM)
    model.forward_backward(my_share(batches[1], mesh))
    second = reduced()
    return {"first_reduced": first, "second_reduced": second}


def two_adapters(mesh: DeviceMesh | None) -> dict:
    """Two LoRA adapters of different shapes trained in turns, with activation checkpointing:
    each DDP wrapper / the FSDP root must reduce the gradients of the adapter in training."""
    torch.manual_seed(0)
    model = TransformersModel(MODEL_ID, device="cpu", device_mesh=mesh, gradient_checkpointing=True)
    model.add_adapter_to_model("first", LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    model.add_adapter_to_model("second", LoraConfig(r=2, lora_alpha=8, target_modules=["q_proj"]))
    for name in ("first", "second"):
        model.set_optimizer("AdamW", lr=1e-2, adapter_name=name)
    batch, losses = global_batches()[0], []
    for name in ("first", "second", "first", "second"):
        model.forward_backward(my_share(batch, mesh), adapter_name=name)
        model.clip_grad_and_step(MAX_GRAD_NORM, adapter_name=name)
        losses.append(model.calculate_metric(adapter_name=name)["loss"])
    return {"losses": losses, "weights": gathered(model, "weights")}


def bf16_run(mesh: DeviceMesh) -> dict:
    """FSDP2 with mixed_precision='bf16': layers compute in bf16 (MixedPrecisionPolicy), while
    the sharded master weights stay float32."""
    torch.manual_seed(0)
    model = TransformersModel(MODEL_ID, device="cpu", device_mesh=mesh, mixed_precision="bf16")
    model.set_optimizer("AdamW", lr=1e-3)
    model.forward_backward(my_share(sum(global_batches(), []), mesh))
    model.clip_grad_and_step(MAX_GRAD_NORM)
    dtypes = sorted({str(p.dtype) for p in model.model.parameters()})
    return {"loss": model.calculate_metric()["loss"], "dtypes": dtypes}


def bad_inputs(kind: str) -> dict[str, str]:
    """The error messages of a mesh sized for other processes and of a late adapter."""
    errors = {}
    wrong = DeviceMesh.from_sizes(dp_size=4, device_type="cpu")
    try:
        TransformersModel(MODEL_ID, device="cpu", device_mesh=wrong).set_optimizer("AdamW")
    except ValueError as exc:
        errors["wrong_world"] = str(exc)
    model = build("full", twinkle.infra.get_global_device_mesh())
    try:
        model.add_adapter_to_model("late", LoraConfig(r=2, target_modules="all-linear"))
    except ValueError as exc:
        errors["late_adapter"] = str(exc)
    return errors


def resume(mesh: DeviceMesh, out: Path) -> dict:
    """LoRA: train, save after step 1, go on; a fresh model resumed from the checkpoint must
    continue with the same losses and weights. Full: save a gathered HF folder."""
    model = build("lora", mesh)
    batches = global_batches()

    def step(m: TransformersModel) -> float:
        for batch in batches:
            m.forward_backward(my_share(batch, mesh))
            m.clip_grad_and_step(MAX_GRAD_NORM)
        return m.calculate_metric()["loss"]

    step(model)
    path = model.save("step1", output_dir=out / "ckpt", consumed_train_samples=8)
    weights_step1 = gathered(model, "weights")
    uninterrupted = [step(model), step(model)]
    resumed_model = build("lora", mesh)
    progress = resumed_model.resume_from_checkpoint(path)
    resumed = [step(resumed_model), step(resumed_model)]
    full = build("full", mesh)
    full_path = full.save("full", output_dir=out / "ckpt")
    return {
        "uninterrupted": uninterrupted,
        "resumed": resumed,
        "progress": progress,
        "weights_uninterrupted": gathered(model, "weights"),
        "weights_resumed": gathered(resumed_model, "weights"),
        "adapter_path": path,
        "weights_step1": weights_step1,
        "full_path": full_path,
        "full_weights": full_model_state_dict(full.model),
    }


def main(out: Path, strategies: list[str]) -> None:
    for strategy in strategies:
        run(strategy, out)
    # NOTE: gloo's C++ teardown can abort a rank ("terminate called without an active
    # exception") when its peer closes the sockets first, even after a barrier. Every rank has
    # written its results, so it leaves without running the destructors.
    dist.barrier()
    os._exit(0)


def run(strategy: str, out: Path) -> None:
    mesh = DeviceMesh.from_sizes(**MESHES[strategy], device_type="cpu")
    twinkle.initialize("local", global_device_mesh=mesh)
    result = {
        "lora": train("lora", mesh),
        "full": train("full", mesh),
        "lora_gradient": first_gradient("lora", mesh),
        "full_gradient": first_gradient("full", mesh),
    }
    if strategy in ("ddp", "fsdp", "tp"):
        result["two_adapters"] = two_adapters(mesh)
    if strategy in ("ddp", "fsdp"):  # tp ranks share a batch: nothing to reduce over data
        result["accumulation"] = accumulation_is_local(mesh)
    if strategy in ("fsdp", "tp"):
        result["resume"] = resume(mesh, out / strategy)
        result["bf16"] = bf16_run(mesh)
    errors = bad_inputs(strategy) if strategy == "ddp" else {}
    if dist.get_rank() == 0:
        torch.save(result, out / f"{strategy}.pt")
        (out / f"{strategy}.json").write_text(json.dumps(errors))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
