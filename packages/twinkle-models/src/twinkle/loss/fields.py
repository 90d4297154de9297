"""Reading loss inputs: finding a field, checking its shape, and aligning per-sequence lists
(what a sampler returns for the completion tokens only) with the label positions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any

import numpy as np
import torch

from twinkle.loss.base import IGNORE_INDEX


def fetch(
    name: str, inputs: Mapping[str, Any], kwargs: Mapping[str, Any], *, owner: str, hint: str
) -> Any:
    """The value of ``name`` from the keyword arguments or ``inputs`` (None when absent);
    ``hint`` tells the user how to pass it and is used when it is given twice."""
    from_kwargs = kwargs.get(name)
    from_inputs = inputs.get(name)
    if from_kwargs is not None and from_inputs is not None:
        raise ValueError(f"{owner}: {name} was given both in inputs and as a keyword; {hint}")
    return from_inputs if from_kwargs is None else from_kwargs


def require(
    name: str, inputs: Mapping[str, Any], kwargs: Mapping[str, Any], *, owner: str, hint: str
) -> Any:
    """Like ``fetch``, but a missing value is an error that says how to pass it."""
    value = fetch(name, inputs, kwargs, owner=owner, hint=hint)
    if value is None:
        raise ValueError(f"{owner} needs {name}: {hint}")
    return value


def outputs_device(outputs: Mapping[str, Any]) -> torch.device:
    """Where the model's outputs live (the first tensor found); inputs are moved there."""
    for value in outputs.values():
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def token_labels(inputs: Mapping[str, Any], owner: str, device: torch.device) -> torch.Tensor:
    """``inputs['labels']`` as an int64 (B, T) tensor on ``device``."""
    if inputs.get("labels") is None:
        raise ValueError(
            f"{owner} needs inputs['labels'] (B, T): the target token ids, -100 outside the loss"
        )
    labels = torch.as_tensor(inputs["labels"])
    if labels.ndim != 2 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(
            f"{owner}: labels must be integer token ids of shape (batch, tokens), "
            f"got dtype {labels.dtype} and shape {tuple(labels.shape)}"
        )
    if labels.numel() == 0:
        raise ValueError(f"{owner}: the batch is empty (labels have shape {tuple(labels.shape)})")
    return labels.to(device=device, dtype=torch.long)


def label_mask(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Boolean (B, T): the label tokens that are predicted (``labels != ignore_index``,
    position 0 excluded since nothing precedes it)."""
    mask = labels != ignore_index
    mask[:, 0] = False
    return mask


def count_label_tokens(mask: torch.Tensor, owner: str) -> torch.Tensor:
    """The number of label tokens as a 0-dim int64 tensor; none at all is an error, since
    dividing by it would give NaN."""
    count = mask.sum()
    if int(count) == 0:
        raise ValueError(
            f"{owner}: the batch has no label tokens (every labels[:, 1:] is -100), so there "
            "is nothing to learn from; check the template's loss masking and that truncation "
            "did not cut off every response"
        )
    return count


def compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float64 stays float64; anything else is computed in float32 (bf16 ratios and sums
    lose too much)."""
    return torch.float64 if tensor.dtype == torch.float64 else torch.float32


def align_to_labels(
    values: Any,
    labels: torch.Tensor,
    *,
    name: str,
    dtype: torch.dtype = torch.float32,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Per-token ``values`` as a (B, T) tensor aligned with ``labels``.

    A tensor or array must already have the labels' shape. A list holds one row per
    sequence, each either T long (already aligned) or exactly as long as the row's label
    tokens, in which case its values are placed at the label positions in order: what a
    sampler returns for the sampled completion. Positions off the labels get 0.
    """
    if isinstance(values, torch.Tensor | np.ndarray):
        tensor = torch.as_tensor(values, dtype=dtype, device=labels.device)
        if tensor.shape != labels.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but labels have {tuple(labels.shape)}; "
                f"give one value per token aligned with labels, or a list of per-sequence "
                f"values for the label tokens only"
            )
        return tensor
    if not isinstance(values, Sequence) or len(values) != labels.shape[0]:
        size = len(values) if isinstance(values, Sequence) else type(values).__name__
        raise ValueError(
            f"{name} must be a (B, T) tensor or a list of one row per sequence "
            f"({labels.shape[0]} rows), got {size}"
        )
    mask = label_mask(labels, ignore_index)
    out = torch.zeros(labels.shape, dtype=dtype, device=labels.device)
    for row, row_values in enumerate(values):
        row_tensor = torch.as_tensor(row_values, dtype=dtype, device=labels.device)
        n_labels = int(mask[row].sum())
        if row_tensor.ndim == 1 and row_tensor.numel() == labels.shape[1]:
            out[row] = row_tensor
        elif row_tensor.ndim == 1 and row_tensor.numel() == n_labels:
            out[row, mask[row]] = row_tensor
        else:
            raise ValueError(
                f"{name}[{row}] has {tuple(row_tensor.shape)} values but row {row} has "
                f"{labels.shape[1]} tokens of which {n_labels} are label tokens; give one "
                f"value per token or one per label token"
            )
    return out


def per_sequence_or_token(
    values: Any, labels: torch.Tensor, *, name: str, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``values`` as (B,) (one per sequence) or (B, T) (per token, see ``align_to_labels``)."""
    is_flat_list = isinstance(values, Sequence) and all(isinstance(v, Real) for v in values)
    is_1d_array = isinstance(values, torch.Tensor | np.ndarray) and values.ndim == 1
    if is_flat_list or is_1d_array:
        tensor = torch.as_tensor(values, dtype=dtype, device=labels.device)
        if tensor.shape != labels.shape[:1]:
            raise ValueError(
                f"{name} has {tensor.shape[0]} values but the batch has {labels.shape[0]} "
                f"sequences; give one value per sequence (B,) or per token (B, T)"
            )
        return tensor
    return align_to_labels(values, labels, name=name, dtype=dtype)
