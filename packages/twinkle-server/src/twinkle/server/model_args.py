"""Range checks for numbers the Twinkle model routes pass on to peft or the optimizer.

peft takes ``LoraConfig(lora_alpha=nan, bias="evil")`` without a word, and
``clip_grad_norm(max_norm=-1)`` flips every gradient's sign (NaN makes them NaN): each is
refused with the field and its range, before the run or the adapter is touched (a model
method's numbers are the ``positive`` of its wire policy, checked with ``POSITIVE``).
"""

from __future__ import annotations

from typing import Any

from twinkle.server.checks import number
from twinkle.server.errors import BadRequest

LORA_BIASES = ("none", "all", "lora_only")
POSITIVE = {"low": 0, "low_open": True}


def check_lora_values(values: dict[str, Any]) -> None:
    """A client's LoRA settings besides ``r`` and ``target_modules`` (checked by the pool)."""
    if "lora_alpha" in values:
        number(values["lora_alpha"], "lora_config lora_alpha", **POSITIVE)
    if "lora_dropout" in values:
        number(values["lora_dropout"], "lora_config lora_dropout", 0, 1, high_open=True)
    if "bias" in values and values["bias"] not in LORA_BIASES:
        raise BadRequest(
            f"lora_config bias must be one of {', '.join(LORA_BIASES)}, got {values['bias']!r}"
        )
    rslora = values.get("use_rslora", False)
    if not isinstance(rslora, bool):
        raise BadRequest(f"lora_config use_rslora must be true or false, got {rslora!r}")
