"""Where a MegatronModel's weights come from: a Hugging Face folder, or a seeded random init."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from twinkle.hub import resolve_model
from twinkle.model.megatron.convert import HFWeightReader
from twinkle.model.transformers.loading import has_weights, load_causal_lm


def hf_source(
    model_id: str | os.PathLike | None, config: Any, seed: int
) -> tuple[Any, HFWeightReader, Path | None]:
    """(Hugging Face config, a reader of its tensors, the local folder or None).

    A folder with safetensors is read lazily, tensor by tensor. A folder with only a
    config (the bundled recipe), or a config object, is the Hugging Face model's own
    random init from ``seed``: the weights TransformersModel builds from the same id.
    """
    if model_id is None and config is None:
        raise ValueError("pass model_id (a hub id, a local folder or a bundled id) or config")
    folder = resolve_model(str(model_id)) if model_id is not None else None
    if folder is not None and has_weights(folder):
        if not any(folder.glob("*.safetensors")):
            raise ValueError(
                f"{model_id!r} holds weights but no safetensors files; MegatronModel reads "
                "safetensors only (re-save the model with save_pretrained)"
            )
        return AutoConfig.from_pretrained(folder), HFWeightReader(folder=folder), folder
    model, folder = load_causal_lm(model_id, None, config, seed)
    return model.config, HFWeightReader(state_dict=model.state_dict()), folder
