"""Run under torchrun with 2 processes (CPU, gloo): LoRA on a Qwen3-MoE's experts and router,
MegatronModel against peft on the Hugging Face model.

Usage: torchrun --nproc_per_node=2 megatron_lora_experts.py OUT_DIR CASE [CASE ...], where a
CASE (``CASES``) is a mesh and a LoraConfig: ``ep1`` (dp2, every rank all experts) and
``ep2`` (dp2 × ep2) with 'all-linear' (attention, experts and router), ``ep2_experts`` (the
expert projections only, rsLoRA), ``etp2`` (dp2, experts split by expert tensor parallel),
``tp2sp`` and ``tp2sp_etp1`` (tp2 with sequence parallel, experts split in two or whole;
the latter targets the router and experts by their peft names), ``pp2`` (two stages).

Per case both sides start from one random peft adapter (B non-zero, saved by peft), train two
AdamW steps (clipped) on the same batch, each data rank on its slice; then Megatron's
adapter is saved, loaded back with peft, merged into an exported model, and resumed. A
Megatron adapter with its own init is exported too, to compare inits across layouts.
Each rank writes ``OUT_DIR/rank<r>.json`` with the figures the test asserts on.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron.core import parallel_state  # noqa: E402
from megatron_parallel import features, max_diff, moe_config  # noqa: E402
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from twinkle import DeviceMesh  # noqa: E402
from twinkle.model import MegatronModel, TransformersModel  # noqa: E402

STEPS = 2
LR = 1e-2
ALL = dict(target_modules="all-linear")
MOE = dict(target_modules=["gate", "gate_proj", "up_proj", "down_proj"])  # router and experts
EXPERTS = dict(target_modules=["gate_proj", "up_proj", "down_proj"], use_rslora=True)
# case -> (mesh sizes, LoraConfig arguments)
CASES = {
    "ep1": ({"dp_size": 2}, ALL),
    "ep2": ({"dp_size": 2, "ep_size": 2}, ALL),
    "ep2_experts": ({"dp_size": 2, "ep_size": 2}, EXPERTS),
    "etp2": ({"dp_size": 2, "etp_size": 2}, ALL),
    "tp2sp": ({"tp_size": 2, "sequence_parallel": True}, ALL),  # etp follows tp
    "tp2sp_etp1": ({"tp_size": 2, "sequence_parallel": True, "etp_size": 1}, MOE),
    "pp2": ({"pp_size": 2}, ALL),
}


def lora_config(arguments: dict, **extra) -> LoraConfig:
    return LoraConfig(r=2, lora_alpha=4, lora_dropout=0.0, **arguments, **extra)


def write_initial_adapter(folder: Path, arguments: dict) -> dict:
    """A random peft adapter (B scaled down so routing stays away from ties), saved on rank 0;
    returns peft's saved names and shapes."""
    if dist.get_rank() == 0:
        hf = TransformersModel(None, config=moe_config(renormalise=True), device="cpu")
        torch.manual_seed(1)
        peft_model = get_peft_model(hf.model, lora_config(arguments, init_lora_weights=False))
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_B" in name:
                    param.mul_(0.1)
        peft_model.save_pretrained(str(folder))
        shapes = {k: list(v.shape) for k, v in get_peft_model_state_dict(peft_model).items()}
    else:
        shapes = None
    box = [shapes]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def build(mesh: DeviceMesh, adapter) -> MegatronModel:
    model = MegatronModel(None, config=moe_config(renormalise=True), device_mesh=mesh, device="cpu")
    model.add_adapter_to_model("default", adapter)
    model.set_optimizer("AdamW", lr=LR)
    return model


def lora_experts_case(case: str, feats: list, root: Path) -> dict:
    sizes, arguments = CASES[case]
    folder = root / case
    folder.mkdir(parents=True, exist_ok=True)
    peft_shapes = write_initial_adapter(folder / "init", arguments)
    mesh = DeviceMesh.from_sizes(device_type="cpu", **sizes)
    mine = feats[mesh.get_slice(len(feats))]
    out: dict = {}

    model = build(mesh, folder / "init")
    reference = TransformersModel(None, config=moe_config(renormalise=True), device="cpu")
    reference.add_adapter_to_model("default", str(folder / "init"))
    reference.set_optimizer("AdamW", lr=LR)
    logps = initial = model.forward_only(feats).logps
    out["init_logps_diff"] = max_diff(logps, reference.forward_only(feats).logps)
    out["grad_norms"], out["reference_grad_norms"], out["logps_diffs"] = [], [], []
    for _ in range(STEPS):
        model.forward_backward(mine)
        out["grad_norms"].append(model.clip_grad_and_step(1.0))
        reference.forward_backward(feats)
        out["reference_grad_norms"].append(reference.clip_grad_and_step(1.0))
        logps = model.forward_only(feats).logps
        out["logps_diffs"].append(max_diff(logps, reference.forward_only(feats).logps))
    out["trained_change"] = max_diff(logps, initial)

    path = model.save("lora", folder, consumed_train_samples=4)
    merged_folder = model.export_hf(folder / "merged")
    if dist.get_rank() == 0:
        saved = load_file(Path(path) / "adapter_model.safetensors")
        out["saved_shapes_equal_peft"] = {k: list(v.shape) for k, v in saved.items()} == peft_shapes
        out["saved_names"] = sorted(k for k in saved if ".mlp." in k and "layers.0." in k)
        loaded = TransformersModel(None, config=moe_config(renormalise=True), device="cpu")
        loaded.add_adapter_to_model("default", path)
        out["peft_logps_diff"] = max_diff(loaded.forward_only(feats).logps, logps)
        out["merged_logps_diff"] = max_diff(
            TransformersModel(merged_folder, device="cpu").forward_only(feats).logps, logps
        )
        peft_merged = loaded.model.merge_and_unload().state_dict()
        exported = TransformersModel(merged_folder, device="cpu").model.state_dict()
        out["merged_weights_diff"] = max(max_diff(exported[n], peft_merged[n]) for n in exported)
    parallel_state.destroy_model_parallel()

    resumed = build(mesh, lora_config(arguments))
    out["progress"] = resumed.resume_from_checkpoint(path)
    out["resumed_logps_equal"] = torch.equal(resumed.forward_only(feats).logps, logps)
    parallel_state.destroy_model_parallel()
    weights_only = build(mesh, lora_config(arguments))
    weights_only.resume_from_checkpoint(path, resume_only_model=True)
    out["weights_only_logps_equal"] = torch.equal(weights_only.forward_only(feats).logps, logps)
    parallel_state.destroy_model_parallel()

    # Megatron's own init: B = 0 (the base model's logps), A as peft draws it; saved to
    # compare across layouts.
    fresh = build(mesh, lora_config(arguments))
    base_logps = reference_base_logps(feats)
    out["own_init_logps_diff"] = max_diff(fresh.forward_only(feats).logps, base_logps)
    own = fresh.save("own_init", folder)
    if dist.get_rank() == 0:
        out["own_init_adapter"] = str(Path(own) / "adapter_model.safetensors")
    parallel_state.destroy_model_parallel()
    return out


def reference_base_logps(feats: list) -> torch.Tensor:
    base = TransformersModel(None, config=moe_config(renormalise=True), device="cpu")
    return base.forward_only(feats).logps


def main() -> None:
    out_dir, cases = Path(sys.argv[1]), sys.argv[2:]
    dist.init_process_group("gloo")  # MegatronModel reuses it
    feats = features()
    results = {case: lora_experts_case(case, feats, out_dir) for case in cases}
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    # NOTE: gloo's C++ teardown can abort a rank ("terminate called without an active
    # exception") when its peer closes the sockets first, even after a barrier. Every rank has
    # written its results, so it leaves without running the destructors.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
