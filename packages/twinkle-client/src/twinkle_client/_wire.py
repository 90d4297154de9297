"""Client-side encoding: data to JSON (no pickle), and names instead of classes."""

from __future__ import annotations

from typing import Any

from twinkle.data_format import sampled_input_features, to_jsonable

LORA_KEYS = ("r", "lora_alpha", "lora_dropout", "target_modules", "bias", "use_rslora")


def name_of(component: Any, what: str) -> str:
    """A registered name for the server's allow-list: a string, or a class's name."""
    if isinstance(component, str):
        return component
    if isinstance(component, type):
        return component.__name__
    raise TypeError(
        f"a remote {what} is named (e.g. 'GRPOLoss') or given as a class; objects cannot be "
        f"sent to the server, got {type(component).__name__}"
    )


def lora_dict(config: Any) -> dict[str, Any]:
    """The LoRA settings the server accepts, from a peft LoraConfig or a dict."""
    if isinstance(config, dict):
        values = dict(config)
    elif hasattr(config, "to_dict"):
        full = config.to_dict()
        if full.get("modules_to_save"):
            raise ValueError("modules_to_save is not supported by the server: train LoRA only")
        values = {key: full[key] for key in LORA_KEYS if full.get(key) is not None}
    else:
        raise TypeError(
            f"pass a LoraConfig or a dict of LoRA settings, got {type(config).__name__}; a "
            "server-side folder cannot be named (load a checkpoint with model.load(path))"
        )
    targets = values.get("target_modules")
    if isinstance(targets, set | tuple):
        values["target_modules"] = sorted(targets)
    return values


def jsonable(value: Any) -> Any:
    return to_jsonable(value)


def clean(args: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for the wire: None dropped (the server's defaults apply)."""
    return {key: jsonable(value) for key, value in args.items() if value is not None}


def batch_rows(inputs: Any) -> Any:
    """The rows to send: a sampler's result (what ``vLLMSampler.sample`` returns, here or
    locally) as its sequences' ``new_input_feature``s; one row as a batch of one."""
    sampled = sampled_input_features(inputs)
    if sampled is not None:
        return sampled
    if isinstance(inputs, dict) or hasattr(inputs, "keys"):
        inputs = [inputs]
    return list(inputs)
