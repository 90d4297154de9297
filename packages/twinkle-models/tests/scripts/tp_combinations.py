"""Tensor parallel on the model families and combined with dp, Ulysses SP and EP, run by
test_tensor_parallel under torchrun; the test compares each case with the same function
run in one process (``mesh=None``).

    torchrun --nproc_per_node=2 tp_combinations.py families OUT  # tp=2 on each family
    torchrun --nproc_per_node=4 tp_combinations.py combined OUT  # dp/fsdp × tp × sp/ep

Each case trains a TransformersModel (full and LoRA) for STEPS AdamW steps on the same
global batches of random token rows (each rank takes its data rank's slice), records the
losses, the first step's gradients gathered whole, and the weights gathered whole, and
saves the full model and the adapter as HF / peft folders, which the test loads in one
process. Rank 0 writes OUT/<layout>.pt.
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
from twinkle.hub import resolve_model
from twinkle.mesh import DeviceMesh
from twinkle.model import TransformersModel
from twinkle.model.transformers.moe import gather_expert_weights
from twinkle.model.transformers.strategy.state_dict import full_model_state_dict

STEPS, ROWS = 3, 4
FAMILIES = {
    "qwen3_moe": "tiny-qwen3-moe",
    "qwen3_5": "tiny-qwen3.5",
    "qwen3_5_moe": "tiny-qwen3.5-moe",
    "deepseek_v3": "tiny-deepseek-v3",
    "glm4_moe": "tiny-glm4.5",
}
# Ulysses under tp=2 splits each rank's 2 key/value heads over 2 ranks: 4 kv heads.
SP_CONFIG = ("tiny-qwen3", {"num_key_value_heads": 4})
COMBINED = {
    "dp_tp": ({"dp_size": 2, "tp_size": 2}, ("tiny-qwen3", {})),
    "dp_tp_sp": ({"dp_size": 2, "tp_size": 2, "ulysses_size": 2}, SP_CONFIG),
    "fsdp_tp_sp": ({"fsdp_size": 2, "tp_size": 2, "ulysses_size": 2}, SP_CONFIG),
    "dp_tp_ep": ({"dp_size": 2, "tp_size": 2, "ep_size": 2}, ("tiny-qwen3-moe", {})),
    "fsdp_tp_ep": ({"fsdp_size": 2, "tp_size": 2, "ep_size": 2}, ("tiny-deepseek-v3", {})),
}
ATTENTION_LORA = ["q_proj", "q_b_proj", "kv_a_proj_with_mqa", "v_proj", "o_proj"]
LORA = [*ATTENTION_LORA, "down_proj", "in_proj_qkv"]
"""Families: the MLPs too (peft adapts fused experts with down_proj); under EP, attention
only (expert parallel refuses an adapter on the experts it shards)."""


def config_of(name: str, changes: dict):
    config = AutoConfig.from_pretrained(resolve_model(f"bundled://{name}"))
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def batches(vocab: int) -> list[list[dict]]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for step in range(STEPS):
        rows = []
        for length in (9 + step, 6, 14, 7)[:ROWS]:
            ids = torch.randint(1, vocab, (length,), generator=generator).tolist()
            rows.append({"input_ids": ids, "labels": ids})
        out.append(rows)
    return out


def build(config, kind: str, mesh: DeviceMesh | None, targets: list[str]) -> TransformersModel:
    torch.manual_seed(0)
    model = TransformersModel(config=config, device="cpu", device_mesh=mesh)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():  # routers start at zero: spread them so experts differ
        for name, param in model.model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.normal_(std=0.5, generator=generator)
    if kind == "lora":
        config = LoraConfig(r=4, lora_alpha=8, target_modules=targets)
        model.add_adapter_to_model("default", config)
        model.set_optimizer("AdamW", lr=1e-2)
    else:
        model.set_optimizer("AdamW", lr=1e-3)
    return model


def gathered_gradients(model: TransformersModel) -> dict[str, torch.Tensor]:
    """Every trainable gradient whole (tp shards joined; EP experts are left out)."""
    grads = {}
    for name, param in model.model.named_parameters():
        if param.grad is None or getattr(param, "expert_parallel_group", None) is not None:
            continue
        grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
        grads[name] = grad.detach().float().cpu().clone()
    return grads


def gathered_weights(model: TransformersModel, mesh: DeviceMesh | None) -> dict:
    """Trainable weights whole on rank 0 ({} elsewhere), experts gathered from EP ranks."""
    trainable = {n for n, p in model.model.named_parameters() if p.requires_grad}
    state = full_model_state_dict(model.model)
    if mesh is not None and mesh.size("ep") > 1:
        experts = gather_expert_weights(model.model)  # a collective
        state.update(experts if state else {})
    return {n: state[n].float().clone() for n in sorted(trainable) if n in state}


def run(
    config, kind: str, mesh: DeviceMesh | None, out: Path | None, targets: list[str] = LORA
) -> dict:
    model = build(config, kind, mesh, targets)
    losses, norms, first_grads = [], [], None
    for rows in batches(config.get_text_config().vocab_size):
        share = rows if mesh is None else rows[mesh.get_slice(len(rows))]
        model.forward_backward(share)
        if first_grads is None:  # normalised and reduced over the ranks (no clipping)
            model.clip_grad_norm(1e9)
            first_grads = gathered_gradients(model)
        norms.append(model.clip_grad_and_step(1.0))
        losses.append(model.calculate_metric()["loss"])
    result = {
        "losses": losses,
        "grad_norms": norms,
        "grads": first_grads,
        "weights": gathered_weights(model, mesh),
    }
    if out is not None:  # one HF / peft folder, gathered
        result["folder"] = model.save(kind, output_dir=out)
    return result


def main(what: str, out: Path) -> None:
    cases = {}
    if what == "families":
        mesh = DeviceMesh.from_sizes(tp_size=2, device_type="cpu")
        twinkle.initialize("local", global_device_mesh=mesh)
        for family, name in FAMILIES.items():
            config = config_of(name, {})
            for kind in ("full", "lora"):
                cases[f"{family}_{kind}"] = run(config, kind, mesh, out / family)
    else:
        for layout, (sizes, (name, changes)) in COMBINED.items():
            mesh = DeviceMesh.from_sizes(**sizes, device_type="cpu")
            if not dist.is_initialized():
                twinkle.initialize("local", global_device_mesh=mesh)
            for kind in ("full", "lora"):
                folder = out / layout if layout == "fsdp_tp_ep" else None
                config = config_of(name, changes)
                cases[f"{layout}_{kind}"] = run(config, kind, mesh, folder, ATTENTION_LORA)
    if dist.get_rank() == 0:
        torch.save(cases, out / f"{what}.pt")
    # NOTE: gloo's C++ teardown can abort a rank when its peer closes the sockets first;
    # every rank has written its results, so it leaves without running the destructors.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
