"""Model-facing data: the encoded InputFeature a Template produces and the ModelOutput a
forward pass returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Self

import numpy as np
from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from twinkle.data_format._arrays import FloatArray, IntArray, MaskArray, is_array_like, seq_len
from twinkle.data_format._base import DataModel
from twinkle.data_format.messages import Message, Tool


class InputFeature(DataModel):
    """One encoded sequence: the output of ``Template.encode``, the input of an
    InputProcessor, and (as ``new_input_feature``) the prompt plus a sampled completion.

    ``labels`` hold -100 outside the loss and are NOT shifted: ``labels[i]`` is the token
    at position ``i`` (normally ``input_ids[i]``), and the loss predicts it from the logits
    at ``i - 1``. Every producer (Template, Sampler) and consumer (Loss) follows this, as
    Hugging Face models do. Lists become int64 numpy arrays; numpy arrays
    and tensors are kept as given. ``labels``, ``position_ids`` and ``attention_mask`` must
    have as many tokens (last axis) as ``input_ids``; ``length`` is that token count,
    derived when omitted. ``messages``, ``tools`` and ``user_data`` carry the trajectory
    the feature came from, so a Reward can read a completion and its ground truth from it.
    Extra keys are allowed: RL code attaches ``advantages``, ``old_logps`` and the like.
    """

    model_config = ConfigDict(extra="allow")

    input_ids: IntArray
    labels: IntArray | None = None
    position_ids: IntArray | None = None
    attention_mask: MaskArray | None = None
    length: int | None = Field(default=None, ge=0)
    messages: list[Message] | None = None
    tools: list[Tool] | None = None
    user_data: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _check_lengths(self) -> Self:
        tokens = seq_len(self.input_ids)
        hint = "; change fields that must agree together with feature.update(...)"
        for name in ("labels", "position_ids", "attention_mask"):
            value = getattr(self, name)
            if value is not None and seq_len(value) != tokens:
                raise ValueError(
                    f"{name} has {seq_len(value)} tokens but input_ids has {tokens}{hint}"
                )
        if self.length is None:
            self.__dict__["length"] = tokens
        elif self.length != tokens:
            raise ValueError(f"length is {self.length} but input_ids has {tokens} tokens{hint}")
        return self

    def update(self, other: Mapping[str, Any] | None = None, /, **changes: Any) -> None:
        """As :meth:`DataModel.update`; new ``input_ids`` without a new ``length`` get their
        length derived again."""
        changes = {**(other or {}), **changes}
        if "input_ids" in changes and "length" not in changes:
            changes["length"] = None
        super().update(changes)


def _loss(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, np.floating):
        value = float(value)
    if isinstance(value, bool) or not (isinstance(value, (int, float)) or is_array_like(value)):
        raise ValueError(f"loss must be a number, an array or a tensor, got {type(value).__name__}")
    return float(value) if isinstance(value, int) else value


class ModelOutput(DataModel):
    """What a forward pass returns: ``logits`` and/or per-token ``logps`` (arrays or
    tensors; lists become float64 arrays) and the ``loss`` (a number or a tensor, kept as
    given so it can still be backpropagated). Extra keys carry whatever else a model or loss
    reports."""

    model_config = ConfigDict(extra="allow")

    logits: FloatArray | None = None
    logps: FloatArray | None = None
    loss: Annotated[Any, BeforeValidator(_loss)] = None
