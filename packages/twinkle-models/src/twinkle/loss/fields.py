"""Reading loss inputs: finding a field, checking its shape, and aligning per-sequence lists
(what a sampler returns for the completion tokens only) with the label positions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from numbers import Integral, Real
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


def require_finite(
    values: torch.Tensor, labels: torch.Tensor, *, name: str, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """``values`` (one per sequence, or per token aligned with ``labels``), checked finite
    where a loss reads them (per token: the label positions only). One NaN or infinite
    advantage or old logp makes the loss NaN, and the step then every trained weight."""
    read = values
    if values.dim() == labels.dim():
        read = torch.where(label_mask(labels, ignore_index), values, 0)
    bad = ~torch.isfinite(read)
    if bool(bad.any()):
        row = int(bad.nonzero()[0][0])
        raise ValueError(
            f"{name}[{row}] holds NaN or an infinite value where the loss reads it; every "
            f"{name} value of a label token (or of a sequence) must be a finite number"
        )
    return values


def align_to_labels(
    values: Any,
    labels: torch.Tensor,
    *,
    name: str,
    dtype: torch.dtype = torch.float32,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Per-token ``values`` as a (B, T) tensor aligned with ``labels``: the one place where
    the shapes users pass for ``old_logps`` (and the like) become the loss's. Every value a
    loss reads must be finite (``require_finite``).

    A tensor or array must already have the labels' shape. A list holds one row per
    sequence, each either T values (already aligned) or one value per label token, placed at
    the label positions in order: what a sampler returns for its completion. A row may also
    be the sampler's own per-token lists of ``(token_id, logprob)`` pairs, the sampled token
    first (``SampledSequence.logprobs``, as ``seq.get('logprobs')`` reads it): the sampled
    tokens' logprobs are taken, and those tokens must be the row's label tokens. Positions
    off the labels get 0.
    """
    aligned = _aligned(values, labels, name=name, dtype=dtype, ignore_index=ignore_index)
    return require_finite(aligned, labels, name=name, ignore_index=ignore_index)


def _aligned(
    values: Any, labels: torch.Tensor, *, name: str, dtype: torch.dtype, ignore_index: int
) -> torch.Tensor:
    if isinstance(values, torch.Tensor | np.ndarray):
        tensor = torch.as_tensor(values, dtype=dtype, device=labels.device)
        if tensor.shape != labels.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} but labels have {tuple(labels.shape)}; "
                f"give one value per token aligned with labels, or a list of per-sequence "
                f"values for the label tokens only"
            )
        return tensor
    if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != len(labels):
        size = len(values) if isinstance(values, Sequence) else type(values).__name__
        raise ValueError(
            f"{name} must be a (B, T) tensor or a list of one row per sequence "
            f"({labels.shape[0]} rows in this batch), got {size}"
        )
    mask = label_mask(labels, ignore_index)
    out = torch.zeros(labels.shape, dtype=dtype, device=labels.device)
    for row, row_values in enumerate(values):
        row_tensor, sampled_tokens = _row_values(row_values, name, row)
        n_labels = int(mask[row].sum())
        if sampled_tokens is None and row_tensor.numel() == labels.shape[1]:
            out[row] = row_tensor.to(dtype=dtype, device=labels.device)
            continue
        if row_tensor.numel() != n_labels:
            raise ValueError(
                f"{name}[{row}] has {row_tensor.numel()} values but row {row} of the batch has "
                f"{n_labels} label tokens (of {labels.shape[1]} tokens); give one value per "
                f"label token (what the sampler returned for that row's completion) or one per "
                f"token, in the order of the batch's rows"
            )
        if sampled_tokens is not None:
            _check_sampled_tokens(sampled_tokens, labels[row, mask[row]], name, row)
        out[row, mask[row]] = row_tensor.to(dtype=dtype, device=labels.device)
    return out


def _row_values(values: Any, name: str, row: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One row of per-token values as (values (n,) float64, the sampled token ids (n,) when
    the row held a sampler's ``(token_id, logprob)`` lists, else None)."""
    hint = (
        f"give {name}[{row}] as one float per label token (e.g. "
        f"[lp[0][1] for lp in seq.logprobs]) or as the sampler's per-token lists of "
        f"(token_id, logprob) pairs (seq.logprobs)"
    )
    if isinstance(values, torch.Tensor | np.ndarray):
        tensor = torch.as_tensor(values)
        if tensor.ndim == 1:
            return tensor.to(torch.float64), None
        if tensor.ndim == 3 and tensor.shape[1] >= 1 and tensor.shape[2] == 2:
            return tensor[:, 0, 1].to(torch.float64), tensor[:, 0, 0].round().long()
        raise ValueError(f"{name}[{row}] has shape {tuple(tensor.shape)}; {hint}")
    if not isinstance(values, Sequence) or isinstance(values, str):
        raise ValueError(f"{name}[{row}] is a {type(values).__name__}; {hint}")
    if all(isinstance(v, Real) for v in values):
        return torch.tensor(values, dtype=torch.float64), None
    tokens, logps = [], []
    for position, entry in enumerate(values):
        pair = entry[0] if isinstance(entry, Sequence) and entry else None
        if not (
            isinstance(pair, Sequence)
            and len(pair) == 2
            and isinstance(pair[0], Integral)
            and isinstance(pair[1], Real)
        ):
            shown = repr(entry) if len(repr(entry)) <= 80 else repr(entry)[:77] + "..."
            raise ValueError(f"{name}[{row}][{position}] is {shown}; {hint}")
        tokens.append(int(pair[0]))
        logps.append(float(pair[1]))
    return torch.tensor(logps, dtype=torch.float64), torch.tensor(tokens, dtype=torch.long)


def _check_sampled_tokens(
    sampled: torch.Tensor, label_tokens: torch.Tensor, name: str, row: int
) -> None:
    """The sampler's tokens of a row must be its label tokens: otherwise the logprobs belong
    to another sequence, and the loss would compare the policy with the wrong tokens."""
    differs = (sampled.to(label_tokens.device) != label_tokens).nonzero()
    if len(differs):
        at = int(differs[0])
        raise ValueError(
            f"{name}[{row}] holds the sampler's logprobs of other tokens than row {row}'s "
            f"label tokens (label token {at} is {int(label_tokens[at])}, the sampler's is "
            f"{int(sampled[at])}): pass each sequence's logprobs with its own "
            f"new_input_feature, in the same order"
        )


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
        return require_finite(tensor, labels, name=name)
    return align_to_labels(values, labels, name=name, dtype=dtype)
