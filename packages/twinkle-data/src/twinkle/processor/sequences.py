"""Check the features of a batch and turn each into 1-D token tensors.

Every check names the feature by its index in the batch, so a bad row from a
dataset or a sampler is found without a debugger.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import ValidationError

from twinkle.data_format import InputFeature

IGNORE_INDEX = -100
"""Label of a token outside the loss."""


@dataclass(frozen=True)
class TokenRow:
    """One feature as long tensors of equal length: ``labels`` is None when it had none.

    ``position_ids`` restart at 0 at every sequence start, so a packed feature
    (several sequences in one row) holds several runs of 0, 1, 2, ...
    """

    input_ids: torch.Tensor
    labels: torch.Tensor | None
    position_ids: torch.Tensor


def _long(value: Any, device: torch.device | None) -> torch.Tensor:
    return torch.as_tensor(value, device=device).long()


def to_token_rows(features: Sequence[InputFeature | Mapping[str, Any]]) -> list[TokenRow]:
    """Validate ``features`` and convert them; raises ValueError/TypeError naming the feature."""
    if not isinstance(features, list | tuple):
        raise TypeError(f"features must be a list of InputFeatures or dicts, got {type(features)}")
    if not features:
        raise ValueError("the batch is empty: give the InputProcessor at least one feature")
    rows = [_to_row(i, feature) for i, feature in enumerate(features)]
    with_labels = [row.labels is not None for row in rows]
    if any(with_labels) and not all(with_labels):
        missing = with_labels.index(False)
        raise ValueError(
            f"feature {missing} has no labels but feature {with_labels.index(True)} has: a batch "
            "has labels on every feature (a training batch) or on none (prompts)"
        )
    return rows


TOKEN_FIELDS = ("input_ids", "labels", "position_ids", "attention_mask")


def _plain_token_lists(feature: Mapping[str, Any]) -> dict[str, torch.Tensor] | None:
    """A dict of token fields given as lists of ints, as 1-D int64 tensors of one length;
    None for anything else, which InputFeature's validation then checks (and names)."""
    if not feature.keys() <= {*TOKEN_FIELDS, "length"}:
        return None
    tensors = {}
    for name in TOKEN_FIELDS:
        value = feature.get(name)
        if value is None:
            continue
        if not isinstance(value, list):
            return None
        try:
            tensor = torch.tensor(value)
        except (TypeError, ValueError, RuntimeError):
            return None
        if tensor.dim() != 1 or tensor.dtype != torch.int64 or tensor.numel() == 0:
            return None
        tensors[name] = tensor
    lengths = {tensor.numel() for tensor in tensors.values()}
    if "input_ids" not in tensors or len(lengths) != 1:
        return None
    if feature.get("length") not in (None, *lengths) or isinstance(feature.get("length"), bool):
        return None
    return tensors


def _to_row(index: int, feature: object) -> TokenRow:
    if isinstance(feature, Mapping) and not isinstance(feature, InputFeature):
        # Lists of ints, the common case, skip the per-element validation (5 ms a batch).
        plain = _plain_token_lists(feature)
        if plain is not None:
            return _row_of(index, plain)
        try:
            feature = InputFeature.model_validate(dict(feature))
        except ValidationError as err:
            problems = "; ".join(_describe(problem) for problem in err.errors())
            raise ValueError(f"feature {index} is not a valid InputFeature: {problems}") from None
    if not isinstance(feature, InputFeature):
        raise TypeError(f"feature {index} must be an InputFeature or a dict, got {type(feature)}")
    fields = {name: getattr(feature, name) for name in TOKEN_FIELDS}
    return _row_of(index, {k: v for k, v in fields.items() if v is not None})


def _row_of(index: int, fields: Mapping[str, Any]) -> TokenRow:
    """The row of one feature's token fields (``input_ids`` and the optional others)."""
    input_ids = torch.as_tensor(fields["input_ids"])
    if input_ids.dim() != 1 or input_ids.numel() == 0:
        raise ValueError(
            f"feature {index}: input_ids must be one non-empty sequence (1-D), got shape "
            f"{tuple(input_ids.shape)}; pass each sequence as a feature of its own"
        )
    device = input_ids.device
    if fields.get("attention_mask") is not None and not bool(
        torch.as_tensor(fields["attention_mask"]).all()
    ):
        raise ValueError(
            f"feature {index} is padded (its attention_mask has zeros); give the InputProcessor "
            "unpadded features: it pads or packs them itself"
        )
    labels = None if fields.get("labels") is None else _long(fields["labels"], device)
    if fields.get("position_ids") is None:
        position_ids = torch.arange(input_ids.numel(), device=device)
    else:
        position_ids = _long(fields["position_ids"], device)
        _check_positions(index, position_ids)
    if labels is not None:
        # Nothing precedes a sequence's first token, so it is never a target; masking it keeps
        # a shifting loss from predicting it from the previous sequence or from padding.
        labels = labels.clone()
        labels[position_ids == 0] = IGNORE_INDEX
    return TokenRow(input_ids.long(), labels, position_ids)


def _describe(problem: Mapping[str, Any]) -> str:
    where = ".".join(map(str, problem["loc"]))
    message = problem["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _check_positions(index: int, position_ids: torch.Tensor) -> None:
    """Positions must run 0, 1, 2, ... and may restart at 0 where a packed sequence begins."""
    if position_ids.dim() != 1:
        raise ValueError(
            f"feature {index}: position_ids must be 1-D, got shape {tuple(position_ids.shape)}"
        )
    steps_ok = (position_ids[1:] == position_ids[:-1] + 1) | (position_ids[1:] == 0)
    if position_ids[0] != 0 or not bool(steps_ok.all()):
        bad = 0 if position_ids[0] != 0 else int((~steps_ok).nonzero()[0]) + 1
        raise ValueError(
            f"feature {index}: position_ids must start at 0 and count up by one, restarting at "
            f"0 where a packed sequence begins; token {bad} has position "
            f"{int(position_ids[bad])}"
        )
