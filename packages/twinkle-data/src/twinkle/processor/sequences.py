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


def _to_row(index: int, feature: object) -> TokenRow:
    if isinstance(feature, Mapping) and not isinstance(feature, InputFeature):
        try:
            feature = InputFeature.model_validate(dict(feature))
        except ValidationError as err:
            problems = "; ".join(_describe(problem) for problem in err.errors())
            raise ValueError(f"feature {index} is not a valid InputFeature: {problems}") from None
    if not isinstance(feature, InputFeature):
        raise TypeError(f"feature {index} must be an InputFeature or a dict, got {type(feature)}")
    input_ids = torch.as_tensor(feature.input_ids)
    if input_ids.dim() != 1 or input_ids.numel() == 0:
        raise ValueError(
            f"feature {index}: input_ids must be one non-empty sequence (1-D), got shape "
            f"{tuple(input_ids.shape)}; pass each sequence as a feature of its own"
        )
    device = input_ids.device
    if feature.attention_mask is not None and not bool(
        torch.as_tensor(feature.attention_mask).all()
    ):
        raise ValueError(
            f"feature {index} is padded (its attention_mask has zeros); give the InputProcessor "
            "unpadded features: it pads or packs them itself"
        )
    labels = None if feature.labels is None else _long(feature.labels, device)
    if feature.position_ids is None:
        position_ids = torch.arange(input_ids.numel(), device=device)
    else:
        position_ids = _long(feature.position_ids, device)
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
