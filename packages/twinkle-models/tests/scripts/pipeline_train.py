"""Train the bundled tiny model pipelined; test_pipeline_parallel compares the results with the
same functions run in one process.

    torchrun --nproc_per_node=2 pipeline_train.py OUT pp        # pp=2 (+ vpp, checkpoints)
    torchrun --nproc_per_node=4 pipeline_train.py OUT pp_dp pp_tp  # pp=2 x dp=2, pp=2 x tp=2
    torchrun --nproc_per_node=8 pipeline_train.py OUT pp_tp_dp  # the documents' mesh

One launch runs every case of its size (a launch's imports cost more than a case). pp_dp
shards each stage with FSDP2; pp and pp_tp also save and resume checkpoints (under
OUT/<case>/). Every case reads parallel_train's global batches (uneven token counts across
data ranks). Rank 0 writes OUT/<case>.pt: losses, metrics and the whole model's trainable
weights, gathered from every stage.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig
from torch.distributed.tensor import DTensor
from transformers import AutoConfig

import twinkle
from twinkle import DeviceMesh
from twinkle.hub import resolve_model
from twinkle.model import TransformersModel
from twinkle.model.checkpoint import CheckpointError
from twinkle.model.transformers.strategy.pipeline import PipelineConfig

sys.path.insert(0, str(Path(__file__).parent))
from parallel_train import MAX_GRAD_NORM, MODEL_ID, global_batches, my_share  # noqa: E402

STEPS = 3
MESHES = {
    "pp": {"pp_size": 2},
    "pp_dp": {"pp_size": 2, "dp_size": 2},
    "pp_tp": {"pp_size": 2, "tp_size": 2},
    "pp_tp_dp": {"pp_size": 2, "tp_size": 2, "dp_size": 2},
}


def four_layers():
    """The tiny model with four decoder layers: two chunks per rank under pp=2 × vpp=2."""
    config = AutoConfig.from_pretrained(resolve_model(MODEL_ID))
    config.num_hidden_layers = 4
    config.layer_types = ["full_attention"] * 4
    return config


def build(kind: str, mesh: DeviceMesh | None, schedule: str | None = None, config=None):
    torch.manual_seed(0)
    pipeline = PipelineConfig(schedule=schedule)
    model = TransformersModel(
        MODEL_ID, device="cpu", device_mesh=mesh, config=config, pipeline_parallel=pipeline
    )
    if kind == "lora":
        lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
        model.add_adapter_to_model("default", lora, gradient_accumulation_steps=2)
        model.set_optimizer("AdamW", lr=1e-2)
    else:
        model.set_optimizer("AdamW", lr=1e-3)
    return model


def weights(model: TransformersModel) -> dict[str, torch.Tensor]:
    """The trainable tensors of the whole model (on rank 0; {} on the others)."""
    plan = model._parallel()
    state = plan.full_state_dict() if plan.distributed else model.model.state_dict()
    trainable = {n for n, p in model.model.named_parameters() if p.requires_grad}
    if plan.pipeline is not None:  # every stage's trainable names, gathered to rank 0
        names = [None] * dist.get_world_size()
        dist.all_gather_object(names, sorted(trainable))
        trainable = {n for part in names for n in part}
        if plan.pipeline.tied_keys is not None:  # one tensor in one process: listed once
            trainable.discard(plan.pipeline.tied_keys[1])
    return {n: state[n].float().clone() for n in sorted(trainable) if n in state}


def tied_copies_differ_by(model: TransformersModel) -> float:
    """How far the last stage's copy of the tied embedding is from the first stage's (0 when
    their gradients are summed before every step)."""
    tied = model._parallel().pipeline.tied
    mine = None
    if tied is not None:  # FSDP2 shards it over the stage's data ranks
        mine = (tied.full_tensor() if isinstance(tied, DTensor) else tied).detach()
    copies = [None] * dist.get_world_size()
    dist.all_gather_object(copies, mine)
    first, last = copies[0], copies[-1]
    return float((first - last).abs().max())


def train(kind: str, mesh: DeviceMesh | None, schedule: str | None = None, config=None) -> dict:
    """STEPS optimizer steps; LoRA accumulates two calls a step, full training one call of
    both batches in micro-batches of 2 rows."""
    model = build(kind, mesh, schedule, config)
    batches = global_batches()
    losses, metrics = [], []
    for _ in range(STEPS):
        for batch in batches if kind == "lora" else [sum(batches, [])]:
            model.forward_backward(my_share(batch, mesh), micro_batch_size=1)
            model.clip_grad_and_step(MAX_GRAD_NORM)
        metrics.append(model.calculate_metric())
        losses.append(metrics[-1]["loss"])
    # Every data rank evaluates the whole batch: the loss is the one process's.
    evaluation = model.forward_only(batches[0])
    result = {
        "losses": losses,
        "metrics": metrics,
        "weights": weights(model),
        "eval_loss": evaluation["loss"],
    }
    if mesh is not None and kind == "full":
        result["tied_diff"] = tied_copies_differ_by(model)
    return result


def resume(mesh: DeviceMesh, out: Path) -> dict:
    """LoRA: save after step 1, go on two steps; a fresh model resumed from the folder must
    continue with the same losses and weights. Full: the gathered HF folder."""
    model = build("lora", mesh)
    batches = global_batches()

    def step(m: TransformersModel) -> float:
        for batch in batches:
            m.forward_backward(my_share(batch, mesh), micro_batch_size=1)
            m.clip_grad_and_step(MAX_GRAD_NORM)
        return m.calculate_metric()["loss"]

    step(model)
    path = model.save("step1", output_dir=out / "ckpt", consumed_train_samples=8)
    weights_step1 = weights(model)
    uninterrupted = [step(model), step(model)]
    resumed_model = build("lora", mesh)
    progress = resumed_model.resume_from_checkpoint(path)
    resumed = [step(resumed_model), step(resumed_model)]
    full = build("full", mesh)
    step(full)
    full_path = full.save("full", output_dir=out / "ckpt")
    reloaded = TransformersModel(full_path, device="cpu", device_mesh=mesh)
    reloaded.set_optimizer("AdamW", lr=1e-3)
    return {
        "uninterrupted": uninterrupted,
        "resumed": resumed,
        "progress": progress,
        "weights_uninterrupted": weights(model),
        "weights_resumed": weights(resumed_model),
        "adapter_path": path,
        "weights_step1": weights_step1,
        "full_path": full_path,
        "full_weights": weights(full),
        "full_reloaded": weights(reloaded),
    }


def on_another_mesh(path: str, weights_step1: dict) -> dict:
    """A pp=2 × tp=2 checkpoint resumed on pp=2 × dp=2 (as many ranks): the optimizer's
    shards do not fit, the gathered weights load."""
    other = build("lora", DeviceMesh.from_sizes(pp_size=2, dp_size=2, device_type="cpu"))
    try:
        other.resume_from_checkpoint(path)
        refusal = None
    except CheckpointError as error:
        refusal = str(error)
    other.resume_from_checkpoint(path, resume_only_model=True)
    loaded = weights(other)
    diff = max((float((loaded[k] - v).abs().max()) for k, v in weights_step1.items()), default=0)
    same_keys = loaded.keys() == weights_step1.keys()
    return {"refusal": refusal, "weights_diff": diff if same_keys else None}


def bad_calls(mesh: DeviceMesh) -> dict[str, str]:
    """The messages of the calls a pipelined model refuses (before any collective)."""
    model = build("full", mesh, "Interleaved1F1B", four_layers())
    rows = sum(global_batches(), [])
    calls = {
        "micro_batch_size": lambda: model.forward_backward(rows[:4], micro_batch_size=3),
        "rounds": lambda: model.forward_backward(rows[:5], micro_batch_size=1),
        "forward": lambda: model.forward(rows[:4]),
        "calculate_loss": lambda: model.calculate_loss(),
    }
    messages = {}
    for name, call in calls.items():
        try:
            call()
        except ValueError as error:
            messages[name] = str(error)
    return messages


def main(out: Path, cases: list[str]) -> None:
    for case in cases:
        run(case, out)
    # NOTE: gloo's teardown can abort a rank whose peer closed the sockets first (see
    # parallel_train.py); every rank has written what it had to.
    dist.barrier()
    os._exit(0)


def run(case: str, out: Path) -> None:
    mesh = DeviceMesh.from_sizes(**MESHES[case], device_type="cpu")
    twinkle.initialize("local", global_device_mesh=mesh)
    result = {"lora": train("lora", mesh, "GPipe"), "full": train("full", mesh, "1F1B")}
    if case == "pp":
        vpp = DeviceMesh.from_sizes(pp_size=2, vpp_size=2, device_type="cpu")
        result["vpp"] = train("full", vpp, "Interleaved1F1B", four_layers())
        result["errors"] = bad_calls(vpp)
        result["resume"] = resume(mesh, out / case)
    if case == "pp_tp":
        result["resume"] = resume(mesh, out / case)
        resumed = result["resume"]
        result["other_mesh"] = on_another_mesh(resumed["adapter_path"], resumed["weights_step1"])
    if dist.get_rank() == 0:
        torch.save(result, out / f"{case}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
