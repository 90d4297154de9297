"""Build the Hugging Face causal LM behind a TransformersModel.

A folder with weights loads them. A folder with only ``config.json`` (the
bundled tiny model is such a recipe) is a random init from a fixed seed, so
every process and every run builds the same model without shipping weights.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from twinkle.hub import resolve_model
from twinkle.utils import get_logger

logger = get_logger()
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")


def has_weights(folder: Path) -> bool:
    return any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS)


def load_causal_lm(
    model_id: str | os.PathLike | None,
    model_cls: type[PreTrainedModel] | None,
    config,
    seed: int,
    **from_pretrained_kwargs,
) -> tuple[PreTrainedModel, Path | None]:
    """The model, and the local folder it came from (None when built from a config object).
    A given config is copied: the model's own is set up later (attention implementation,
    cache) and must not change the caller's."""
    if model_id is None and config is None:
        raise ValueError("pass model_id (a hub id, a local folder or a bundled id) or config")
    if config is not None:
        config = copy.deepcopy(config)
        from_pretrained_kwargs = {**from_pretrained_kwargs, "config": config}
    folder = resolve_model(str(model_id)) if model_id is not None else None
    auto = model_cls or AutoModelForCausalLM
    if folder is not None and has_weights(folder):
        # Weights the checkpoint lacks (a value or classification head) start from the seed,
        # not from whatever the process's global generator holds by then.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return auto.from_pretrained(folder, **from_pretrained_kwargs), folder
    if config is None:
        if not (folder / "config.json").is_file():
            adapter = (folder / "adapter_config.json").is_file()
            hint = (
                "it holds a LoRA adapter: load the base model, then "
                "add_adapter_to_model(name, this_folder) or resume_from_checkpoint(this_folder)"
                if adapter
                else "it has no config.json"
            )
            raise ValueError(f"{model_id!r} is not a model folder: {hint}")
        config = AutoConfig.from_pretrained(folder)
    logger.info(f"{model_id or type(config).__name__}: no weights found, random init (seed {seed})")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # Auto classes (AutoModel for an encoder) build from a config; model classes are called.
        model = auto.from_config(config) if hasattr(auto, "from_config") else auto(config)
    dtype = from_pretrained_kwargs.get("dtype")
    return (model.to(dtype) if dtype is not None else model), folder
