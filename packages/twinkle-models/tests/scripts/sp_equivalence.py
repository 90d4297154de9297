"""Ulysses SP(2) against one process, run by test_sequence_parallel under torchrun (2 ranks).

    torchrun --nproc_per_node=2 sp_equivalence.py OUT

Functions (plain Hugging Face models): every rank builds the same tiny model twice (same
seed), a reference trained on the whole batch in this process and an SP copy trained on
its sequence shard, its gradients summed over the SP group (the data-parallel strategy's
job in the library). Both take the same SGD steps on the same batches; each case records
the per-step losses, the largest gradient difference of the first step and the largest
parameter difference at the end. (SGD, not AdamW: Adam divides by the gradient's own size,
so on parameters whose gradients are ~1e-7, float32 rounding noise of 1e-10 becomes a
visible parameter difference.) Cases: a padded batch of odd-length rows (sdpa and eager
attention) and a packed row (Qwen3), a padded batch and a packed row on Qwen3.5
(GatedDeltaNet layers run on the gathered sequence; packed, through twinkle.patch's varlen
layers), a padded batch on a Qwen3-MoE.

TransformersModel: the same batches through its own loop (AdamW, clipping) with the
mesh (FSDP2 over the two SP ranks), full training on padded batches and LoRA with
activation checkpointing on packed ones, against a TransformersModel without a mesh; and
a tiny Qwen3-MoE with output_router_logits=True (the router load-balancing loss, computed
from router logits gathered over the SP group) trained with SGD.

Plus a forward without labels (gathered logits) and the bad inputs that must fail at setup.
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
from transformers import AutoConfig, AutoModelForCausalLM

from twinkle.hub import resolve_model
from twinkle.loss import logps_from_logits
from twinkle.mesh import DeviceMesh
from twinkle.model import TransformersModel
from twinkle.model.transformers.strategy.sequence_parallel import (
    SequenceParallelConfig,
    SequenceParallelStrategy,
    sequence_parallel_of,
)
from twinkle.model.transformers.strategy.state_dict import full_model_state_dict
from twinkle.patch import apply_for_batch
from twinkle.processor import InputProcessor

STEPS, LR = 3, 0.5
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
SMALL.update(head_dim=16, vocab_size=512, intermediate_size=128, pad_token_id=0)


def tiny_config(kind: str):
    if kind == "qwen3":
        return AutoConfig.from_pretrained(resolve_model("bundled://tiny-qwen3"))
    if kind == "qwen3_5":
        return AutoConfig.for_model(
            "qwen3_5_text",
            **SMALL,
            layer_types=["linear_attention", "full_attention"],
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_conv_kernel_dim=4,
        )
    return AutoConfig.for_model(
        "qwen3_moe", **SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32
    )


def build(config, attention: str = "sdpa") -> torch.nn.Module:
    torch.manual_seed(0)
    config = copy.deepcopy(config)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    return model.float()


def feature_batches(vocab: int) -> list[list[dict]]:
    """STEPS batches of 3 rows with odd lengths (so SP padding is exercised), fixed seed."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for step in range(STEPS):
        features = []
        for length in (7 + step, 12, 5):
            ids = torch.randint(1, vocab, (length,), generator=generator)
            labels = ids.clone()
            labels[: length // 3] = -100  # a prompt outside the loss
            features.append({"input_ids": ids.tolist(), "labels": labels.tolist()})
        out.append(features)
    return out


def batches(vocab: int, packed: bool) -> list[dict]:
    processor = InputProcessor(padding_free=packed)
    return [processor(features) for features in feature_batches(vocab)]


def masked_loss(logps: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    mask = labels[:, 1:] != -100
    return -(logps[:, 1:] * mask).sum(), int(mask.sum())


def reference_step(model, batch) -> torch.Tensor:
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
    logits = model(**inputs, use_cache=False).logits
    loss, tokens = masked_loss(logps_from_logits(logits, batch["labels"]).logps, batch["labels"])
    return loss / tokens


def sp_step(model, sp, batch) -> torch.Tensor:
    inputs, shard = sp.shard(batch)
    logits = model(**inputs, use_cache=False).logits
    loss, tokens = masked_loss(shard.outputs(logits)["logps"], batch["labels"])
    (loss / tokens).backward()
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, group=sp.group)  # partials of one SP group sum up
    return loss.detach() / tokens


def max_diff(a: torch.nn.Module, b: torch.nn.Module, view) -> float:
    pairs = zip(a.parameters(), b.parameters(), strict=True)
    return max(float((view(x) - view(y)).abs().max()) for x, y in pairs)


def run_case(kind: str, packed: bool, mesh: DeviceMesh, attention: str = "sdpa") -> dict:
    config = tiny_config(kind)
    reference, parallel = build(config, attention), build(config, attention)
    sp = SequenceParallelStrategy(mesh, SequenceParallelConfig()).apply(parallel)
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in (reference, parallel)]
    losses_ref, losses_sp, grad_diff = [], [], None
    for batch in batches(config.vocab_size, packed):
        for model in (reference, parallel):  # Qwen3.5 + packed: twinkle.patch's varlen layers
            apply_for_batch(model, batch)
        loss = reference_step(reference, batch)
        loss.backward()
        losses_ref.append(float(loss.detach()))
        losses_sp.append(float(sp_step(parallel, sp, batch)))
        if grad_diff is None:
            grad_diff = max_diff(reference, parallel, lambda p: p.grad)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    return {
        "losses_ref": losses_ref,
        "losses_sp": losses_sp,
        "max_grad_diff": grad_diff,
        "max_param_diff": max_diff(reference, parallel, lambda p: p.detach()),
    }


def rows_seen(model: TransformersModel) -> list[list[int]]:
    """The (rows, tokens) shape of every forward's input on this rank: (1, ·) ran packed."""
    shapes: list[list[int]] = []
    embeddings = model._hf_model().get_input_embeddings()
    embeddings.register_forward_hook(lambda m, args, out: shapes.append(list(args[0].shape)))
    return shapes


def train_model(mesh: DeviceMesh | None, lora: bool, packed: bool | None) -> dict:
    """TransformersModel's own loop (FSDP over the SP ranks, from the mesh) on the bundled
    model: losses per step, the gathered trainable weights and the forwards' input shapes.
    ``packed`` None: the processor leaves the choice to the model (padding-free by default)."""
    torch.manual_seed(0)  # the LoRA init draws from the global generator
    # LoRA also recomputes activations: the all-to-alls run again inside the backward.
    model = TransformersModel(
        "bundled://tiny-qwen3", device="cpu", device_mesh=mesh, gradient_checkpointing=lora
    )
    if lora:
        model.add_adapter_to_model("default", LoraConfig(r=4, target_modules="all-linear"))
    if packed is not None:
        model.set_processor(InputProcessor, padding_free=packed)
    model.set_optimizer("AdamW", lr=1e-2 if lora else 1e-3)
    losses, shapes = [], rows_seen(model)
    for features in feature_batches(model.model.config.vocab_size):
        losses.append(model.forward_backward(features).loss)
        model.clip_grad_and_step(1.0)
    names = {n for n, p in model.model.named_parameters() if p.requires_grad}
    state = full_model_state_dict(model.model)
    strategy = type(sequence_parallel_of(model.model)).__name__  # what the model path ran
    weights = {n: state[n].float() for n in names if n in state}
    return {"losses": losses, "weights": weights, "strategy": strategy, "shapes": shapes}


def train_moe(mesh: DeviceMesh | None, aux_coef: float) -> dict:
    """TransformersModel on a tiny Qwen3-MoE whose loss includes the router load-balancing
    term (SGD, no effective clipping: a gradient counted twice would show)."""
    config = tiny_config("moe")
    config.output_router_logits, config.router_aux_loss_coef = True, aux_coef
    model = TransformersModel(config=config, device="cpu", device_mesh=mesh)
    model.set_processor(InputProcessor)
    model.set_optimizer("SGD", lr=LR)
    losses = []
    for features in feature_batches(config.vocab_size):
        losses.append(model.forward_backward(features).loss)
        model.clip_grad_and_step(1e9)
    state = full_model_state_dict(model.model)
    return {"losses": losses, "weights": {n: w.float() for n, w in state.items()}}


def moe_aux_case(mesh: DeviceMesh) -> dict:
    """SP(2) against one process; plus how far one process moves when the aux term counts
    twice (what SP would do if each of its 2 ranks' identical aux loss were summed)."""
    reference, parallel = train_moe(None, 0.5), train_moe(mesh, 0.5)
    doubled = train_moe(None, 1.0)
    diffs = [(reference["weights"][n] - w).abs().max() for n, w in parallel["weights"].items()]
    twice = [(reference["weights"][n] - w).abs().max() for n, w in doubled["weights"].items()]
    return {
        "losses_ref": reference["losses"],
        "losses_sp": parallel["losses"],
        "weights_compared": len(diffs),
        "max_param_diff": float(max(diffs)) if diffs else None,
        "doubled_aux_param_diff": float(max(twice)) if twice else None,
    }


def model_case(
    mesh: DeviceMesh, lora: bool, packed: bool | None, reference_packed: bool | None = None
) -> dict:
    """SP against one process; ``reference_packed`` sets the one process's processor
    apart (default: the same as the SP run's)."""
    reference = train_model(None, lora, packed if reference_packed is None else reference_packed)
    parallel = train_model(mesh, lora, packed)
    diffs = [(reference["weights"][n] - w).abs().max() for n, w in parallel["weights"].items()]
    return {
        "losses_ref": reference["losses"],
        "losses_sp": parallel["losses"],
        "strategy": parallel["strategy"],
        "shapes": parallel["shapes"],
        "weights_compared": len(diffs),  # rank 0 gathers the weights; the others get none
        "max_param_diff": float(max(diffs)) if diffs else None,
    }


def unlabelled_forward(mesh: DeviceMesh) -> dict:
    """TransformersModel.forward without labels under SP (padding-free by default): the
    logits of the padded rows, as one process returns them on the real tokens (one process
    packs, so its padding's logits are 0), and the shapes each SP forward ran."""
    logits, shapes = [], None
    for parallel in (None, mesh):
        torch.manual_seed(0)
        model = TransformersModel("bundled://tiny-qwen3", device="cpu", device_mesh=parallel)
        features = feature_batches(model.model.config.vocab_size)[0]
        rows = [{"input_ids": f["input_ids"]} for f in features]
        shapes = rows_seen(model)
        logits.append(model.forward(rows).logits)
    width = logits[1].shape[1]
    real = torch.stack([torch.arange(width) < len(row["input_ids"]) for row in rows])
    return {
        "shape": list(logits[1].shape),
        "max_diff": float((logits[0] - logits[1]).abs()[real].max()),
        "shapes": shapes,
    }


def gathered_logits(mesh: DeviceMesh) -> float:
    """A forward without labels returns the full-sequence logits on every SP rank."""
    config = tiny_config("qwen3")
    reference, parallel = build(config), build(config)
    sp = SequenceParallelStrategy(mesh).apply(parallel)
    batch = batches(config.vocab_size, packed=False)[0]
    batch.pop("labels")
    with torch.no_grad():
        expected = reference(**batch, use_cache=False).logits
        inputs, shard = sp.shard(batch)
        got = shard.outputs(parallel(**inputs, use_cache=False).logits)["logits"]
    return float((expected - got).abs().max())


def setup_error(kind: str, mesh: DeviceMesh, **overrides) -> str:
    config = tiny_config(kind)
    for name, value in overrides.items():
        setattr(config, name, value)
    try:
        SequenceParallelStrategy(mesh).apply(build(config))
    except (ValueError, NotImplementedError) as exc:
        return str(exc)
    return ""


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    mesh = DeviceMesh.from_sizes(world_size=2, ulysses_size=2, device_type="cpu")
    result = {
        "padded": run_case("qwen3", packed=False, mesh=mesh),
        "padded_eager": run_case("qwen3", packed=False, mesh=mesh, attention="eager"),
        "packed": run_case("qwen3", packed=True, mesh=mesh),
        "qwen3_5": run_case("qwen3_5", packed=False, mesh=mesh),
        "qwen3_5_packed": run_case("qwen3_5", packed=True, mesh=mesh),
        "moe": run_case("moe", packed=False, mesh=mesh),
        "logits_diff": gathered_logits(mesh),
        "model_full_padded": model_case(mesh, lora=False, packed=False),
        "model_lora_packed": model_case(mesh, lora=True, packed=True),
        # The documents' loop sets no processor: SP packs each batch's padding away, and
        # equals one process training padded batches.
        "model_full_default": model_case(mesh, lora=False, packed=None, reference_packed=False),
        "model_lora_default": model_case(mesh, lora=True, packed=None, reference_packed=False),
        "unlabelled_default": unlabelled_forward(mesh),
        # Heads that do not split fall back to ring attention (cp_equivalence), which runs
        # full-attention models only: a hybrid one is refused at setup.
        "bad_kv_heads": setup_error("qwen3_5", mesh, num_key_value_heads=1),
        "model_moe_aux": moe_aux_case(mesh),
    }
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    # NOTE: gloo's C++ teardown can abort a rank ("terminate called without an active
    # exception") when its peer closes the sockets first, even after a barrier. Every rank has
    # written its results, so it leaves without running the destructors.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
