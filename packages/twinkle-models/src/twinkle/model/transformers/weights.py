"""Weights in and out of a checkpoint folder: a peft LoRA adapter, or a full Hugging Face model.

An adapter is written in peft's own layout (``adapter_config.json`` and
``adapter_model.safetensors`` at the top of the folder, whatever the adapter's
name), so ``PeftModel.from_pretrained(base_model, folder)`` reads it. A full model
is written by ``save_pretrained`` (safetensors) with the tokenizer files of the
folder it was loaded from, so the folder works as a ``model_id`` and with
``AutoModelForCausalLM``/``AutoTokenizer``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel, get_peft_model_state_dict, set_peft_model_state_dict
from peft.utils.other import EMBEDDING_LAYER_NAMES
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from twinkle.model.checkpoint import ADAPTER_FILES, CheckpointError, full_weight_files
from twinkle.model.transformers.moe.expert_checkpoint import fuse_expert_weights

TOKENIZER_PATTERNS = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "chat_template*",
    "*.tiktoken",
    "spiece.model",
)
# LoraConfig fields that change what the adapter computes: a checkpoint must agree on them.
ADAPTER_MATH_FIELDS = (
    "peft_type",
    "r",
    "lora_alpha",
    "target_modules",
    "use_rslora",
    "use_dora",
    "lora_bias",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
)


def save_adapter(
    model: PeftModel,
    adapter_name: str,
    folder: Path,
    state_dict: dict[str, torch.Tensor] | None = None,
    *,
    tensors: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Write one adapter's weights and config into ``folder``; returns the config as JSON.
    ``state_dict`` (the model's, gathered from shards) replaces the model's own tensors;
    ``tensors`` (keyed as peft saves them, gathered from pipeline stages, each of which holds
    only its own layers' modules, which peft's filter keeps to) replace the tensors file."""
    scratch = folder / ".peft"
    extra: dict[str, Any] = {"save_embedding_layers": embedding_policy(model, adapter_name)}
    if state_dict is not None:
        extra["state_dict"] = state_dict
    model.save_pretrained(str(scratch), selected_adapters=[adapter_name], **extra)
    # peft puts an adapter not named 'default' into a subfolder of that name.
    written = scratch if adapter_name == "default" else scratch / adapter_name
    for name in ADAPTER_FILES:
        (written / name).replace(folder / name)
    if tensors is not None:
        save_file(tensors, folder / ADAPTER_FILES[1], metadata={"format": "pt"})
    shutil.rmtree(scratch)
    return json.loads((folder / ADAPTER_FILES[0]).read_text(encoding="utf-8"))


def embedding_policy(model: PeftModel, adapter_name: str) -> bool | str:
    """peft's ``save_embedding_layers`` for this adapter. When LoRA targets ``lm_head`` or
    ``embed_tokens``, peft would save those whole base matrices with every adapter (hundreds of
    MB on a real vocabulary); LoRA leaves them unchanged and Twinkle never resizes the
    vocabulary, so only the LoRA tensors are saved. Otherwise peft's own check ('auto') stays."""
    targets = model.peft_config[adapter_name].target_modules or ()
    targets = [targets] if isinstance(targets, str) else list(targets)
    return False if any(t in EMBEDDING_LAYER_NAMES for t in targets) else "auto"


def load_adapter_weights(model: PeftModel, adapter_name: str, folder: Path) -> None:
    """Load a saved adapter's weights into the existing adapter ``adapter_name``."""
    weights = read_adapter_weights(model, adapter_name, folder)
    set_peft_model_state_dict(model, weights, adapter_name=adapter_name)


def read_adapter_weights(
    model: PeftModel, adapter_name: str, folder: Path, *, part: bool = False
) -> dict[str, torch.Tensor]:
    """A saved adapter's tensors (keyed as peft saves them), once checked against the adapter
    ``adapter_name``: the saved LoRA config must agree with the adapter's on everything that
    changes the computation, and the saved tensors must be exactly the adapter's. With
    ``part`` the model holds some of the layers (a pipeline stage): the saved tensors must
    include its adapter's, and only those are returned.
    """
    saved_config = json.loads((folder / ADAPTER_FILES[0]).read_text(encoding="utf-8"))
    current = _comparable(model.peft_config[adapter_name].to_dict())
    saved = _comparable(saved_config)
    differ = [k for k in ADAPTER_MATH_FIELDS if current.get(k) != saved.get(k)]
    if differ:
        details = "; ".join(f"{k}: saved {saved.get(k)!r}, here {current.get(k)!r}" for k in differ)
        raise CheckpointError(
            f"the adapter in {folder} does not match adapter {adapter_name!r} of this model "
            f"({details}); add the adapter with the LoraConfig it was trained with"
        )
    weights = load_file(folder / ADAPTER_FILES[1])
    expected = set(
        get_peft_model_state_dict(
            model,
            adapter_name=adapter_name,
            save_embedding_layers=embedding_policy(model, adapter_name),
        )
    )
    if part and expected <= set(weights):
        return {k: v for k, v in weights.items() if k in expected}
    if set(weights) != expected:
        raise CheckpointError(
            f"{folder / ADAPTER_FILES[1]} does not hold adapter {adapter_name!r}'s tensors: "
            f"missing {sorted(expected - set(weights))[:5]}, "
            f"unexpected {sorted(set(weights) - expected)[:5]}"
        )
    return weights


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    """A LoraConfig dict with its module collections as sorted lists, as JSON holds them."""
    return {
        key: sorted(value)
        if isinstance(value, set | frozenset)
        or (key in ("target_modules", "modules_to_save") and isinstance(value, list))
        else value
        for key, value in config.items()
    }


def save_full(
    model: PreTrainedModel,
    folder: Path,
    tokenizer_source: Path | None,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> None:
    """A Hugging Face model folder: config, safetensors weights and tokenizer files."""
    model.save_pretrained(str(folder), state_dict=state_dict)
    if tokenizer_source is None or not tokenizer_source.is_dir():
        return
    for pattern in TOKENIZER_PATTERNS:
        for path in tokenizer_source.glob(pattern):
            if path.is_file() and not (folder / path.name).exists():
                shutil.copy2(path, folder / path.name)


def read_full_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a full model folder, named as the model in memory names them (the
    per-expert tensors ``save_pretrained`` writes fused back into the MoE parameters)."""
    weights: dict[str, torch.Tensor] = {}
    for name in full_weight_files(folder):
        weights.update(load_file(folder / name))
    return fuse_expert_weights(weights)


def load_full_weights(model: PreTrainedModel, folder: Path) -> None:
    """Copy the weights of a full model folder into ``model`` in place.

    Keys the files leave out are accepted only when they are tied to a saved one
    (``lm_head.weight`` sharing the embedding, for instance).
    """
    current = model.state_dict()
    weights = read_full_weights(folder)
    unexpected = sorted(set(weights) - set(current))
    if unexpected:
        raise CheckpointError(
            f"{folder} holds tensors this model lacks ({', '.join(unexpected[:5])}): "
            f"it was saved from another architecture or layout; build the model from it "
            f"with TransformersModel(model_id={str(folder)!r})"
        )
    model.load_state_dict(weights, strict=False)
    loaded = set(weights)
    saved_storage = {current[k].untyped_storage().data_ptr() for k in loaded}
    missing = [
        k
        for k in current
        if k not in loaded and current[k].untyped_storage().data_ptr() not in saved_storage
    ]
    if missing:
        raise CheckpointError(
            f"{folder} lacks weights of this model: {', '.join(missing[:5])}"
            f"{' ...' if len(missing) > 5 else ''}"
        )
