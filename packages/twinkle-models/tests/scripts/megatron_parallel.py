"""Run under torchrun (CPU, gloo): MegatronModel layouts against one-process TransformersModel.

Usage: torchrun --nproc_per_node=N megatron_parallel.py OUT_DIR CASE [CASE ...], where a
CASE is ``tp2``, ``pp2``, ``dp2``, ``dp2dist`` (with the distributed optimizer),
``tp2pp2``, ``vpp`` (pp2 × vpp2 on a 4-layer model), ``ep2`` (dp2 × ep2 on a tiny
Qwen3-MoE), ``pp2ep2`` (4 ranks),
``resume`` (save under tp2, resume under dp2) or ``lora`` (LoRA under tp2, exported as a
peft adapter and as a merged model, resumed). Each rank writes ``OUT_DIR/rank<r>.json``
with, per case, the figures the test asserts on. Cases run one after another in one
launch; Megatron's parallel state is torn down between them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from twinkle import DeviceMesh
from twinkle.hub import resolve_model
from twinkle.model import MegatronModel, TransformersModel
from twinkle.model.checkpoint import CheckpointError
from twinkle.model.megatron.cpu_mode import cpu_mode
from twinkle.template import build_template

MODEL = "bundled://tiny-qwen3"
STEPS = 3
LR = 1e-3
SIZES = {
    "tp2": {"tp_size": 2},
    "pp2": {"pp_size": 2},
    "dp2": {"dp_size": 2},
    "dp2dist": {"dp_size": 2},
    "tp2pp2": {"tp_size": 2, "pp_size": 2},
    "vpp": {"pp_size": 2, "vpp_size": 2},
    "ep2": {"dp_size": 2, "ep_size": 2},
    "pp2ep2": {"pp_size": 2, "dp_size": 2, "ep_size": 2},
}


def features() -> list:
    template = build_template("Qwen3_5Template", model_id=MODEL, max_length=64)
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"what is {i} plus {i}?"},
                {"role": "assistant", "content": f"it is {2 * i}, of course. " * (1 + i % 3)},
            ]
        }
        for i in range(4)
    ]
    return template.batch_encode(rows)


def four_layer_config():
    config = AutoConfig.from_pretrained(resolve_model(MODEL))
    config.num_hidden_layers = 4
    config.layer_types = ["full_attention"] * 4
    return config


def moe_config(renormalise: bool):
    """The bundled tiny Qwen3 as a Qwen3-MoE: 4 experts of width 32, top-2, every layer;
    ``renormalise`` is norm_topk_prob (the two routings map to different Megatron ones)."""
    from transformers import Qwen3MoeConfig

    dense = AutoConfig.from_pretrained(resolve_model(MODEL)).to_dict()
    keep = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "tie_word_embeddings",
        "max_position_embeddings",
        "rope_parameters",
        "pad_token_id",
        "eos_token_id",
    )
    return Qwen3MoeConfig(
        **{k: dense[k] for k in keep},
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=renormalise,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def compare_training(model, reference, feats, mesh) -> dict:
    """Losses of STEPS optimizer steps; each data rank trains on its slice of the batch."""
    mine = feats[mesh.get_slice(len(feats))]
    losses, reference_losses, norms, reference_norms = [], [], [], []
    for _ in range(STEPS):
        model.forward_backward(mine)
        norms.append(model.clip_grad_and_step(1.0))
        reference.forward_backward(feats)
        reference_norms.append(reference.clip_grad_and_step(1.0))
        losses.append(model.forward_only(feats).loss)
        reference_losses.append(reference.forward_only(feats).loss)
    # one step on the gradient of the summed loss (the Tinker API's optim_step): its norm is
    # the whole batch's, whatever the layout
    model.forward_backward(mine)
    reference.forward_backward(feats)
    return {
        "losses": losses,
        "reference_losses": reference_losses,
        "grad_norms": norms,
        "reference_grad_norms": reference_norms,
        "summed_grad_norm": model.step_with(max_grad_norm=1e9, normalise=False),
        "reference_summed_grad_norm": reference.step_with(max_grad_norm=1e9, normalise=False),
    }


def equivalence(case: str, feats: list, make_config=None, model_id: str = MODEL) -> dict:
    configs = {
        "vpp": four_layer_config,
        "ep2": lambda: moe_config(renormalise=True),
        "pp2ep2": lambda: moe_config(renormalise=False),
    }
    make_config = configs.get(case, make_config)
    config = make_config() if make_config is not None else None
    mesh = DeviceMesh.from_sizes(device_type="cpu", **SIZES[case])
    model_id = None if config is not None else model_id
    model = MegatronModel(
        model_id,
        config=config,
        device_mesh=mesh,
        device="cpu",
        use_distributed_optimizer=case == "dp2dist",
    )
    reference = TransformersModel(model_id, config=config, device="cpu")
    out = {}
    mine, ref = model.forward_only(feats), reference.forward_only(feats)
    out["logps_max_diff"] = max_diff(mine.logps, ref.logps)
    out["loss_diff"] = abs(mine.loss - ref.loss)
    if parallel_state.get_pipeline_model_parallel_world_size() == 1:
        out["logits_max_diff"] = logits_diff(model, reference, feats)
    weights = model._hf_weights()
    ref_state = reference.model.state_dict()
    out["round_trip_exact"] = all(torch.equal(weights[n], ref_state[n]) for n in weights)
    out["stage_tensor_names"] = sorted(weights)
    with tempfile.TemporaryDirectory() as tmp:
        folder = model.export_hf(Path(tmp) / "export")
        if dist.get_rank() == 0:
            exported = AutoModelForCausalLM.from_pretrained(folder).state_dict()
            out["export_exact"] = all(torch.equal(exported[n], ref_state[n]) for n in ref_state)
        dist.barrier()
    model.set_optimizer("AdamW", lr=LR)
    reference.set_optimizer("AdamW", lr=LR)
    out.update(compare_training(model, reference, feats, mesh))
    out["metrics"] = model.calculate_metric()
    out["reference_metrics"] = reference.calculate_metric()
    return out


def logits_diff(model, reference, feats) -> float:
    """Raw logits of the Megatron chunk (vocabulary gathered over tp) against HF's."""
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    state = model._state(None)
    batch, _, _ = model._collate(feats, state, {})
    chunk = model.chunks[0]
    chunk.eval()
    with torch.no_grad(), cpu_mode():  # the chunk itself, outside MegatronModel's methods
        local = chunk(batch["input_ids"], None, None)
        logits = gather_from_tensor_model_parallel_region(local)[..., : model.spec.vocab_size]
        hf = reference.model(input_ids=batch["input_ids"]).logits
    return max_diff(logits, hf)


def resume_case(feats: list, folder: Path) -> dict:
    """Save under tp2; a dp2 model refuses the full resume and restores the weights alone."""
    out = {}
    model = MegatronModel(MODEL, device_mesh=DeviceMesh.from_sizes(tp_size=2, device_type="cpu"))
    model.set_optimizer("AdamW", lr=LR)
    model.forward_backward(feats)
    model.clip_grad_and_step()
    saved_logps = model.forward_only(feats).logps
    path = model.save("tp2", folder, consumed_train_samples=4)
    parallel_state.destroy_model_parallel()
    other = MegatronModel(MODEL, device_mesh=DeviceMesh.from_sizes(dp_size=2, device_type="cpu"))
    other.set_optimizer("AdamW", lr=LR)
    try:
        other.resume_from_checkpoint(path)
        out["full_resume_error"] = None
    except CheckpointError as exc:
        out["full_resume_error"] = str(exc)
    progress = other.resume_from_checkpoint(path, resume_only_model=True)
    out["progress"] = progress
    out["weights_only_logps_diff"] = max_diff(other.forward_only(feats).logps, saved_logps)
    return out


def lora_case(
    feats: list,
    folder: Path,
    sizes: dict | None = None,
    model_config=None,
    targets: str | list[str] = "all-linear",
) -> dict:
    """LoRA trained under tp2 (or ``sizes``; on ``model_config`` instead of the bundled model);
    peft on the Hugging Face model reproduces it."""
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0)
    mesh = DeviceMesh.from_sizes(device_type="cpu", **(sizes or {"tp_size": 2}))
    model_id = MODEL if model_config is None else None

    def build():
        model = MegatronModel(model_id, config=model_config, device_mesh=mesh, device="cpu")
        model.add_adapter_to_model("default", config)
        model.set_optimizer("AdamW", lr=1e-2)
        return model

    out = {}
    model = build()
    before = model.forward_only(feats).logps
    initial = model.save("init", folder)
    # The reference trains the same initial adapter with peft on the Hugging Face model.
    peft_model = TransformersModel(model_id, config=model_config, device="cpu")
    peft_model.add_adapter_to_model("default", initial)
    peft_model.set_optimizer("AdamW", lr=1e-2)
    out["losses"], out["reference_losses"] = [], []
    for _ in range(3):
        out["losses"].append(model.forward_backward(feats).loss)
        model.clip_grad_and_step(1.0)
        out["reference_losses"].append(peft_model.forward_backward(feats).loss)
        peft_model.clip_grad_and_step(1.0)
    logps = model.forward_only(feats).logps
    out["trained_change"] = max_diff(logps, before)
    reference = TransformersModel(model_id, config=model_config, device="cpu")
    weights, ref_state = model._hf_weights(), reference.model.state_dict()
    out["base_frozen"] = all(torch.equal(weights[n], ref_state[n]) for n in weights)
    out["configs"] = model.get_train_configs()
    path = model.save("lora", folder, consumed_train_samples=8)
    merged = model.export_hf(folder / "merged")
    if dist.get_rank() == 0:
        reference.add_adapter_to_model("default", path)
        out["peft_logps_diff"] = max_diff(reference.forward_only(feats).logps, logps)
        exported = TransformersModel(merged, device="cpu")
        out["merged_logps_diff"] = max_diff(exported.forward_only(feats).logps, logps)
        out["adapter_files"] = sorted(p.name for p in Path(path).iterdir())
        keys = load_file(Path(path) / "adapter_model.safetensors")
        out["adapted"] = sorted({k.split(".lora_")[0].rsplit(".", 1)[-1] for k in keys})
    parallel_state.destroy_model_parallel()
    resumed = build()
    out["progress"] = resumed.resume_from_checkpoint(path)
    out["resumed_logps_equal"] = torch.equal(resumed.forward_only(feats).logps, logps)
    parallel_state.destroy_model_parallel()
    return out


def main() -> None:
    out_dir, cases = Path(sys.argv[1]), sys.argv[2:]
    feats = features()
    results = {}
    for case in cases:
        if case == "resume":
            results[case] = resume_case(feats, out_dir / "checkpoints")
        elif case == "lora":
            results[case] = lora_case(feats, out_dir / "lora")
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
