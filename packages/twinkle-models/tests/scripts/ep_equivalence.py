"""Expert parallel EP(2) against one process, run by test_expert_parallel under torchrun.

    torchrun --nproc_per_node=2 ep_equivalence.py OUT

Every rank builds the same tiny MoE twice (same seed): a reference trained in this
process on the whole global batch, and an EP copy that keeps 2 of the 4 experts and
trains on its data slice of the batch (EP ranks are data-parallel ranks). Gradients go
as under DDP: the summed loss's dense gradients are averaged over the ranks, the expert
ones reduced by ``sync_expert_gradients``, and all scaled by ranks / global tokens (what
TransformersModel does). Both take the same SGD steps; each case records losses, the
largest gradient difference of the first step and the largest parameter difference at the
end (this rank's experts against the reference's same experts). Cases: Qwen3-MoE and
Qwen3.5-MoE (shared expert), and the bundled DeepSeek-V3 (MLA attention, a dense first
layer, sigmoid routing with a bias over 2 expert groups, a shared-experts MLP) and GLM-4.5
(the same routing in one group, partial rotary attention).

TransformersModel: its own loop (AdamW, clipping) with the mesh, against a
TransformersModel without a mesh on the global batch: FSDP2 for the dense model with the
experts as FSDP units of their own (ep folded into fsdp=2), and DDP (dp=2) with the
experts left out of it, and EP(2) with Ulysses SP(2) on the same two ranks (each rank
dispatches its sequence shard's tokens); the FSDP2 case also on the bundled DeepSeek-V3 and
GLM-4.5. With 4 ranks the FSDP cases run on EP(2) × ep_fsdp(2), for Qwen3-MoE and
DeepSeek-V3.

Checkpoints (2 ranks, under FSDP2 and under DDP; 4 ranks, EP(2) × ep_fsdp(2), Qwen3-MoE
and DeepSeek-V3): a run trains
1 step, saves, trains 2 more; rank 0 loads the folder with transformers alone and compares
it with the gathered weights; a model with other random weights resumes the folder (weights
cut back to its experts, optimizer state through torch.distributed.checkpoint) and takes the
2 steps, and another resumes the weights alone (its second loss must differ: AdamW starts
afresh).
Results go to OUT/rank<r>.json.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from twinkle.hub import resolve_model
from twinkle.loss import logps_from_logits
from twinkle.mesh import DeviceMesh
from twinkle.model import TransformersModel
from twinkle.model.checkpoint import CheckpointError
from twinkle.model.transformers.moe import (
    ExpertParallelConfig,
    apply_expert_parallel,
    expert_parameters,
    gather_expert_weights,
    sync_expert_gradients,
)
from twinkle.model.transformers.strategy.state_dict import full_model_state_dict
from twinkle.processor import InputProcessor

STEPS, LR, ROWS = 3, 0.5, 4
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
SMALL.update(head_dim=16, vocab_size=512, pad_token_id=0, num_experts_per_tok=2)
SMALL.update(moe_intermediate_size=32)


def tiny_config(kind: str):
    if kind in ("deepseek_v3", "glm4_moe"):
        name = {"deepseek_v3": "tiny-deepseek-v3", "glm4_moe": "tiny-glm4.5"}[kind]
        return AutoConfig.from_pretrained(resolve_model(f"bundled://{name}"))
    if kind == "qwen3_moe":
        return AutoConfig.for_model("qwen3_moe", **SMALL, num_experts=4, intermediate_size=128)
    return AutoConfig.for_model(
        "qwen3_5_moe_text",
        **SMALL,
        num_experts=4,
        shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
    )


def build(config) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa")
    model = model.float()
    for name, param in model.named_parameters():
        if "gate.weight" in name:  # routers start at zero: spread them so experts differ
            torch.nn.init.normal_(param, std=0.5)
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):  # the load-balancing bias shifts choices
            buffer.copy_(torch.linspace(-0.2, 0.2, buffer.numel()))
    return model


def batches(vocab: int) -> list[dict]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for step in range(STEPS):
        rows = []
        for length in (9 + step, 6, 12, 7)[:ROWS]:
            ids = torch.randint(1, vocab, (length,), generator=generator)
            rows.append({"input_ids": ids.tolist(), "labels": ids.tolist()})
        out.append(rows)
    return out


def summed_loss(model, rows) -> tuple[torch.Tensor, int]:
    batch = InputProcessor()(rows)
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
    mask = batch["labels"][:, 1:] != -100
    logps = logps_from_logits(logits, batch["labels"]).logps[:, 1:]
    return -(logps * mask).sum(), int(mask.sum())


def max_diff(reference, parallel, rank: int, view) -> float:
    """Largest difference, comparing each EP expert weight with the reference's slice."""
    experts = {id(p) for p in expert_parameters(parallel)}
    worst = 0.0
    for ref, par in zip(reference.parameters(), parallel.parameters(), strict=True):
        ref_value, par_value = view(ref), view(par)
        if id(par) in experts:
            local = par.shape[0]
            ref_value = ref_value[rank * local : (rank + 1) * local]
        worst = max(worst, float((ref_value - par_value).abs().max()))
    return worst


def run_case(kind: str, mesh: DeviceMesh) -> dict:
    config = tiny_config(kind)
    reference, parallel = build(config), build(config)
    apply_expert_parallel(parallel, mesh, ExpertParallelConfig())
    experts = {id(p) for p in expert_parameters(parallel)}
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in (reference, parallel)]
    losses_ref, losses_ep, grad_diff = [], [], None
    for rows in batches(config.vocab_size):
        loss, tokens = summed_loss(reference, rows)
        (loss / tokens).backward()
        losses_ref.append(float(loss.detach()) / tokens)
        local, _ = summed_loss(parallel, rows[mesh.get_slice(len(rows))])
        local.backward()
        total = local.detach().clone()
        dist.all_reduce(total)
        losses_ep.append(float(total) / tokens)
        ranks = dist.get_world_size()
        for param in parallel.parameters():
            if id(param) not in experts and param.grad is not None:
                dist.all_reduce(param.grad)  # dense: averaged over the ranks, as DDP does
                param.grad.div_(ranks)
        sync_expert_gradients(parallel)
        for param in parallel.parameters():  # the wrapper's one scale: ranks / global tokens
            param.grad.mul_(ranks / tokens)
        if grad_diff is None:
            grad_diff = max_diff(reference, parallel, mesh.ep_rank, lambda p: p.grad)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    return {
        "losses_ref": losses_ref,
        "losses_ep": losses_ep,
        "max_grad_diff": grad_diff,
        "max_param_diff": max_diff(reference, parallel, mesh.ep_rank, lambda p: p.detach()),
        "local_experts": [p.shape[0] for p in expert_parameters(parallel)],
    }


def train_model(mesh: DeviceMesh | None, kind: str = "qwen3_moe") -> dict:
    """TransformersModel's loop on a tiny MoE of ``kind``: per-step losses, gathered weights."""
    model = TransformersModel(config=tiny_config(kind), device="cpu", device_mesh=mesh)
    init_routers(model, 2)
    model.set_optimizer("AdamW", lr=1e-2)
    losses, norms = [], []
    for rows in batches(model.model.config.vocab_size):
        share = rows if mesh is None else rows[mesh.get_slice(len(rows))]
        model.forward_backward(share)
        norms.append(model.clip_grad_and_step(1.0))
        losses.append(model.calculate_metric()["loss"])
    weights = full_model_state_dict(model.model)
    if mesh is not None and weights:  # the state dict holds this EP rank's experts only
        weights.update(gather_expert_weights(model.model))
    elif mesh is not None:
        gather_expert_weights(model.model)  # a collective: every rank takes part
    return {"losses": losses, "grad_norms": norms, "weights": weights}


def init_routers(model: TransformersModel, seed: int) -> None:
    """Routers start at zero: spread them so experts differ; shift the load-balancing bias
    of the bias-routed families (DeepSeek-V3, GLM-4.5) so it changes choices."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.model.named_parameters():
            if "gate.weight" in name:
                param.normal_(std=0.5, generator=generator)
        for name, buffer in model.model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.linspace(-0.2, 0.2, buffer.numel()))


def checkpoint_case(mesh: DeviceMesh, folder: Path, kind: str = "qwen3_moe") -> dict:
    """Save under EP after 1 of 3 steps; load the folder in one process; resume from it."""
    config = tiny_config(kind)
    rows_per_step, losses = batches(config.vocab_size), []

    def model_with(seed: int) -> TransformersModel:
        torch.manual_seed(seed)
        model = TransformersModel(config=config, device="cpu", device_mesh=mesh)
        init_routers(model, seed)
        model.set_optimizer("AdamW", lr=1e-2)
        return model

    def step(model: TransformersModel, rows: list) -> float:
        model.forward_backward(rows[mesh.get_slice(len(rows))])
        model.clip_grad_and_step(1.0)
        return model.calculate_metric()["loss"]

    model = model_with(2)
    losses = [step(model, rows_per_step[0])]
    path = model.save("ep", folder)
    # Copies: on CPU the state dict shares the parameters' storage, which the next step changes.
    weights = {name: t.clone() for name, t in full_model_state_dict(model.model).items()}
    experts = gather_expert_weights(model.model)
    losses += [step(model, rows) for rows in rows_per_step[1:]]
    result = {"losses": losses}
    if dist.get_rank() == 0:  # the folder alone, as a one-process Hugging Face model
        loaded = AutoModelForCausalLM.from_pretrained(path).state_dict()
        weights.update(experts)
        result["folder_keys_match"] = set(loaded) == set(weights)
        result["folder_max_diff"] = max(
            float((loaded[name] - tensor).abs().max()) for name, tensor in weights.items()
        )
        result["folder_experts"] = [loaded[name].shape[0] for name in sorted(experts)]
        # Weights-only onto another mesh: a TransformersModel in one process loads the folder.
        single = TransformersModel(config=config, device="cpu")
        single.load(path)
        result["single_load_max_diff"] = max(
            float((single.model.state_dict()[name] - tensor).abs().max())
            for name, tensor in weights.items()
        )
    for key, only_model in (("resumed", False), ("resumed_weights_only", True)):
        resumed = model_with(3)  # other weights: the resume must replace every one
        resumed.resume_from_checkpoint(path, resume_only_model=only_model)
        result[key] = [step(resumed, rows) for rows in rows_per_step[1:]]
    if mesh.size("fsdp") > 1:  # the same ranks without EP: the optimizer state does not fit
        dense = DeviceMesh.from_sizes(fsdp_size=dist.get_world_size(), device_type="cpu")
        other = TransformersModel(config=config, device="cpu", device_mesh=dense)
        other.set_optimizer("AdamW", lr=1e-2)
        try:
            other.resume_from_checkpoint(path)
            result["other_layout_error"] = None
        except CheckpointError as error:
            result["other_layout_error"] = str(error)
    return result


def adapter_checkpoint_case(mesh: DeviceMesh, folder: Path) -> dict:
    """A LoRA adapter (dense modules: experts are not adapted under EP) saved after 1 step
    and resumed by a fresh model: its second-step loss against the uninterrupted run's."""
    rows_per_step = batches(SMALL["vocab_size"])[:2]

    def model_with(seed: int) -> TransformersModel:
        torch.manual_seed(seed)
        model = TransformersModel(config=tiny_config("qwen3_moe"), device="cpu", device_mesh=mesh)
        init_routers(model, 2)
        config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"])
        model.add_adapter_to_model("default", config)
        model.set_optimizer("AdamW", lr=1e-2)
        return model

    def step(model: TransformersModel, rows: list) -> float:
        model.forward_backward(rows[mesh.get_slice(len(rows))])
        model.clip_grad_and_step(1.0)
        return model.calculate_metric()["loss"]

    model = model_with(2)
    step(model, rows_per_step[0])
    path = Path(model.save("lora", folder))
    lora = {k: v.clone() for k, v in full_model_state_dict(model.model).items() if "lora_" in k}
    result = {"loss": step(model, rows_per_step[1])}
    if dist.get_rank() == 0:
        saved = load_file(path / "adapter_model.safetensors")
        named = {k.replace(".default.", ".", 1): v for k, v in lora.items()}
        result["adapter_keys_match"] = set(saved) == set(named) and len(saved) == 12
        result["adapter_max_diff"] = max(float((saved[k] - named[k]).abs().max()) for k in saved)
    resumed = model_with(3)  # another adapter initialisation: the resume must replace it
    resumed.resume_from_checkpoint(path)
    result["resumed_loss"] = step(resumed, rows_per_step[1])
    return result


def model_case(mesh: DeviceMesh, kind: str = "qwen3_moe") -> dict:
    reference, parallel = train_model(None, kind), train_model(mesh, kind)
    diffs = [
        (reference["weights"][name] - weight).abs().max()
        for name, weight in parallel["weights"].items()
    ]
    return {
        "losses_ref": reference["losses"],
        "losses_ep": parallel["losses"],
        "grad_norms_ref": reference["grad_norms"],
        "grad_norms_ep": parallel["grad_norms"],
        "weights_compared": len(diffs),  # rank 0 gathers the weights; the others get none
        "weights_expected": len(reference["weights"]),
        "max_param_diff": float(max(diffs)) if diffs else None,
    }


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    world = dist.get_world_size()
    if world == 4:
        mesh = DeviceMesh.from_sizes(world_size=4, ep_size=2, ep_fsdp_size=2, device_type="cpu")
        result = {
            "model_ep_fsdp": model_case(mesh),
            "checkpoint_ep_fsdp": checkpoint_case(mesh, out / "ep_fsdp"),
            "model_ep_fsdp_deepseek_v3": model_case(mesh, "deepseek_v3"),
            "checkpoint_ep_fsdp_deepseek_v3": checkpoint_case(
                mesh, out / "ep_fsdp_deepseek", "deepseek_v3"
            ),
        }
    else:
        # dp=2: DDP, experts stay whole and sync_expert_gradients reduces them; with
        # world_size=2 EP folds into fsdp=2: FSDP2 shards the dense model and the experts.
        mesh = DeviceMesh.from_sizes(dp_size=2, ep_size=2, device_type="cpu")
        fsdp_mesh = DeviceMesh.from_sizes(world_size=2, ep_size=2, device_type="cpu")
        result = {
            "qwen3_moe": run_case("qwen3_moe", mesh),
            "qwen3_5_moe": run_case("qwen3_5_moe", mesh),
            "deepseek_v3": run_case("deepseek_v3", mesh),
            "glm4_moe": run_case("glm4_moe", mesh),
            "model_ep": model_case(fsdp_mesh),
            "model_ep_ddp": model_case(mesh),
            "model_ep_deepseek_v3": model_case(fsdp_mesh, "deepseek_v3"),
            "model_ep_glm4_moe": model_case(fsdp_mesh, "glm4_moe"),
            "model_ep_sp": model_case(
                DeviceMesh.from_sizes(world_size=2, ep_size=2, ulysses_size=2, device_type="cpu")
            ),
            "checkpoint_ep": checkpoint_case(fsdp_mesh, out / "fsdp"),
            "checkpoint_ep_ddp": checkpoint_case(mesh, out / "ddp"),
            "adapter_checkpoint_ep": adapter_checkpoint_case(fsdp_mesh, out / "lora"),
        }
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    # NOTE: gloo's C++ teardown can abort a rank ("terminate called without an active
    # exception") when its peer closes the sockets first, even after a barrier. Every rank has
    # written its results, so it leaves without running the destructors.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
