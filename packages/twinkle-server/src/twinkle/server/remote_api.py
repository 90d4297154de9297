"""The remote API, derived from the local components themselves.

For each component a client can drive remotely, the methods it may call and their
parameters, read with ``inspect`` from the local class (MultiLoraTransformersModel,
Dataset, DataLoader, the Sampler protocol). The server publishes this at
``GET /api/v1/twinkle/api``; twinkle-client's proxies carry the same table and a test
checks the two agree, so a proxy cannot drift from the component it mirrors.
"""

from __future__ import annotations

import inspect
from typing import Any

MODEL_METHODS = (
    "add_adapter_to_model",
    "set_loss",
    "set_optimizer",
    "set_lr_scheduler",
    "set_template",
    "set_processor",
    "forward_backward",
    "forward_only",
    "clip_grad_norm",
    "step",
    "zero_grad",
    "lr_step",
    "clip_grad_and_step",
    "calculate_metric",
    "get_train_configs",
    "save",
    "load",
    "resume_from_checkpoint",
)
SAMPLER_METHODS = ("sample", "set_template")
DATASET_METHODS = ("set_template", "map", "encode")
DATALOADER_METHODS = ("get_state", "resume_from_checkpoint")
SERVER_ONLY = {"self", "adapter_name", "output_dir", "device_mesh", "remote_group"}


def parameters(func: Any) -> list[str]:
    """Parameter names a client passes (``**`` for a catch-all of keyword arguments)."""
    names = []
    # add_adapter_to_model's adapter_name is the client's display name for its run.
    dropped = (
        SERVER_ONLY - {"adapter_name"} if func.__name__ == "add_adapter_to_model" else SERVER_ONLY
    )
    for param in inspect.signature(func).parameters.values():
        if param.name in dropped:
            continue
        names.append("**" if param.kind is param.VAR_KEYWORD else param.name)
    return names


def describe() -> dict[str, dict[str, list[str]]]:
    from twinkle.dataloader import DataLoader
    from twinkle.dataset import Dataset
    from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel
    from twinkle.sampler.base import Sampler

    tables = {
        "model": (MultiLoraTransformersModel, MODEL_METHODS),
        "sampler": (Sampler, SAMPLER_METHODS),
        "dataset": (Dataset, DATASET_METHODS),
        "dataloader": (DataLoader, DATALOADER_METHODS),
    }
    return {
        component: {name: parameters(getattr(cls, name)) for name in methods}
        for component, (cls, methods) in tables.items()
    }
