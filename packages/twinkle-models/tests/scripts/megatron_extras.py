"""Run under torchrun with 2 processes (CPU, gloo): the MegatronModel cases beyond Qwen3.

Usage: torchrun --nproc_per_node=2 megatron_extras.py OUT_DIR CASE [CASE ...], where a CASE is

* ``llama_tp2``, ``llama_dp2``, ``qwen2_tp2``: a tiny Llama (untied embeddings, a vocabulary
  tp does not divide) or Qwen2 (q/k/v biases) saved as a safetensors folder with random
  weights and biases; logits against transformers at tp2 and tp1 (dp2), the weights' round
  trip and the exported folder;
* ``lora_pp2``: LoRA under pp2, trained like peft on the Hugging Face model and exported;
* ``lora_moe_ep2``: LoRA on a Qwen3-MoE's attention under dp2 × ep2, the same against peft;
  LoRA with dropout on its experts is refused (peft refuses it too; expert LoRA itself is
  tested by megatron_lora_experts);
* ``tp2sp``, ``moe_tp2sp``, ``moe_etp2``, ``moe_tp2sp_etp1``: sequence parallel and expert
  tensor parallel layouts (``LAYOUTS``) against transformers, as in megatron_parallel;
* ``distopt``: dp2 with the distributed optimizer, saved after two steps and resumed by a
  fresh model, against the uninterrupted run; a model without the distributed optimizer
  refuses the full resume and names the difference.

Each rank writes ``OUT_DIR/rank<r>.json`` with the figures the test asserts on.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron.core import parallel_state  # noqa: E402
from megatron_parallel import (  # noqa: E402
    MODEL,
    SIZES,
    equivalence,
    features,
    logits_diff,
    lora_case,
    max_diff,
    moe_config,
)
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from twinkle import DeviceMesh  # noqa: E402
from twinkle.hub import resolve_model  # noqa: E402
from twinkle.model import MegatronModel, TransformersModel  # noqa: E402
from twinkle.model.checkpoint import CheckpointError  # noqa: E402

LR = 1e-3
# case -> (mesh sizes, Qwen3-MoE or the bundled Qwen3)
LAYOUTS = {
    "tp2sp": ({"tp_size": 2, "sequence_parallel": True}, False),
    "moe_tp2sp": ({"tp_size": 2, "sequence_parallel": True}, True),  # etp follows tp
    "moe_etp2": ({"dp_size": 2, "etp_size": 2}, True),  # dense dp2, experts split in two
    "moe_tp2sp_etp1": ({"tp_size": 2, "sequence_parallel": True, "etp_size": 1}, True),
}


def family_config(model_type: str):
    """The bundled tiny Qwen3's sizes as a Llama (untied) or a Qwen2 (q/k/v biases)."""
    from transformers import LlamaConfig, Qwen2Config

    base = AutoConfig.from_pretrained(resolve_model(MODEL))
    sizes = dict(
        vocab_size=base.vocab_size,  # 3909: padded to 3910 under tp2
        hidden_size=base.hidden_size,
        intermediate_size=base.intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=base.num_attention_heads,
        num_key_value_heads=base.num_key_value_heads,
        head_dim=base.head_dim,
        rms_norm_eps=base.rms_norm_eps,
        max_position_embeddings=base.max_position_embeddings,
        pad_token_id=base.pad_token_id,
        eos_token_id=base.eos_token_id,
        tie_word_embeddings=False,
    )
    if model_type == "llama":
        return LlamaConfig(**sizes, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
    return Qwen2Config(**sizes, use_sliding_window=False)


def family_folder(model_type: str, root: Path) -> Path:
    """A safetensors folder with random weights; biases non-zero so they matter."""
    folder = root / model_type
    if dist.get_rank() == 0 and not folder.exists():
        torch.manual_seed(7)
        model = AutoModelForCausalLM.from_config(family_config(model_type))
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(".bias"):
                    param.normal_(0.0, 0.5)
        model.save_pretrained(folder)
    dist.barrier()
    return folder


def family_case(case: str, feats: list, root: Path) -> dict:
    model_type, layout = case.split("_")
    folder = family_folder(model_type, root)
    mesh = DeviceMesh.from_sizes(device_type="cpu", **{f"{layout[:2]}_size": 2})
    model = MegatronModel(folder, device_mesh=mesh, device="cpu")
    reference = TransformersModel(folder, device="cpu")
    out = {"spec": [model.spec.model_type, model.spec.qkv_bias, model.spec.tie_embeddings]}
    out["logits_max_diff"] = logits_diff(model, reference, feats)
    mine, ref = model.forward_only(feats), reference.forward_only(feats)
    out["logps_max_diff"] = max_diff(mine.logps, ref.logps)
    weights, ref_state = model._hf_weights(), reference.model.state_dict()
    out["round_trip_exact"] = set(weights) == set(ref_state) and all(
        torch.equal(weights[n], ref_state[n]) for n in weights
    )
    exported = Path(model.export_hf(root / f"export_{case}"))
    if dist.get_rank() == 0:
        state = AutoModelForCausalLM.from_pretrained(exported).state_dict()
        out["export_exact"] = all(torch.equal(state[n], ref_state[n]) for n in ref_state)
    dist.barrier()
    return out


def train(model, feats: list, steps: int) -> list[float]:
    mine = feats[model.device_mesh.get_slice(len(feats))]
    losses = []
    for _ in range(steps):
        losses.append(model.forward_backward(mine).loss)
        model.clip_grad_and_step(1.0)
    return losses + [model.forward_only(feats).loss]


def distopt_case(feats: list, root: Path) -> dict:
    """Resume under dp2 with the distributed optimizer, bit for bit; another set-up refuses."""
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")

    def build(distributed: bool = True) -> MegatronModel:
        model = MegatronModel(
            MODEL, device_mesh=mesh, device="cpu", use_distributed_optimizer=distributed
        )
        model.set_optimizer("AdamW", lr=LR)
        model.set_lr_scheduler("default", lr_decay_steps=6, max_lr=LR, lr_warmup_steps=1)
        return model

    out = {}
    out["uninterrupted"] = train(build(), feats, 4)
    parallel_state.destroy_model_parallel()
    first = build()
    train(first, feats, 2)
    path = first.save("distopt", root / "checkpoints", consumed_train_samples=8)
    parallel_state.destroy_model_parallel()
    resumed = build()
    out["progress"] = resumed.resume_from_checkpoint(path)
    out["resumed"] = train(resumed, feats, 2)
    out["files"] = sorted(p.name for p in (Path(path) / "megatron").iterdir())
    parallel_state.destroy_model_parallel()
    plain = build(distributed=False)
    try:
        plain.resume_from_checkpoint(path)
        out["plain_error"] = None
    except CheckpointError as exc:
        out["plain_error"] = str(exc)
    return out


def lora_moe_case(feats: list, folder: Path) -> dict:
    """LoRA on a Qwen3-MoE's attention under dp2 × ep2, against peft; expert targets with
    dropout refused."""
    from peft import LoraConfig

    mesh = {"dp_size": 2, "ep_size": 2}
    attention = ["q_proj", "k_proj", "v_proj", "o_proj"]
    out = lora_case(feats, folder, mesh, moe_config(renormalise=True), attention)
    model = MegatronModel(
        None,
        config=moe_config(renormalise=True),
        device_mesh=DeviceMesh.from_sizes(device_type="cpu", **mesh),
        device="cpu",
    )
    try:
        model.add_adapter_to_model(
            "default", LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.1)
        )
        out["experts_error"] = None
    except ValueError as exc:
        out["experts_error"] = str(exc)
    return out


def main() -> None:
    out_dir, cases = Path(sys.argv[1]), sys.argv[2:]
    dist.init_process_group("gloo")  # the cases write files before building a model
    feats = features()
    results = {}
    for case in cases:
        if case == "lora_pp2":
            results[case] = lora_case(feats, out_dir / "lora_pp2", {"pp_size": 2})
        elif case == "lora_moe_ep2":
            results[case] = lora_moe_case(feats, out_dir / "lora_moe_ep2")
        elif case == "distopt":
            results[case] = distopt_case(feats, out_dir)
        elif case in LAYOUTS:
            SIZES[case], moe = LAYOUTS[case]
            results[case] = equivalence(case, feats, partial(moe_config, True) if moe else None)
        else:
            results[case] = family_case(case, feats, out_dir)
        parallel_state.destroy_model_parallel()
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    # NOTE: gloo's C++ teardown can abort a rank ("terminate called without an active
    # exception") when its peer closes the sockets first, even after a barrier. Every rank has
    # written its results, so it leaves without running the destructors.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
