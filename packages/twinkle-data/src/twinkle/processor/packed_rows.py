"""The padded rows of a collated batch as one packed row, and per-token outputs back to rows.

A padded batch keeps its rows for the loss, the metrics and what a model returns; only
the forward runs packed, on its real tokens alone, with positions restarting at 0 for
every sequence (how transformers' attention and twinkle's varlen linear attention tell the
sequences apart). ``PackedRows.to_rows`` scatters the packed outputs back, so every row
gets the values it would have had padded and zeros on its padding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from twinkle.processor.sequences import IGNORE_INDEX


@dataclass(frozen=True)
class PackedRows:
    """One packed row made from a ``[B, T]`` padded batch.

    ``input_ids``, ``position_ids`` and ``labels`` (None without labels) are ``[1, N]``
    over the ``N`` real tokens in row order; ``token_index`` holds each one's flat index
    in ``B * T``; ``lengths`` the real tokens of each row.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor | None
    token_index: torch.Tensor
    lengths: torch.Tensor
    shape: tuple[int, int]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """The forward's keyword arguments: no attention mask, the positions part the rows."""
        return {"input_ids": self.input_ids, "position_ids": self.position_ids}

    def varlen_batch(self) -> dict[str, Any]:
        """The packed row as ``InputProcessor(padding_free=True)`` collates one: positions
        and ``cu_seq_lens`` (int32, one span per non-empty row) mark the sequences, so a
        strategy that splits a row over ranks (Ulysses, ring attention) keeps them apart;
        ``labels`` with the first token of every sequence unlabelled."""
        lengths = self.lengths[self.lengths > 0]
        bounds = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
        longest = int(lengths.max()) if lengths.numel() else 0
        batch: dict[str, Any] = {
            **self.model_inputs(),
            "cu_seq_lens_q": bounds,
            "cu_seq_lens_k": bounds.clone(),
            "max_length_q": longest,
            "max_length_k": longest,
        }
        if self.labels is not None:
            batch["labels"] = self.labels
        return batch

    def to_rows(self, values: torch.Tensor) -> torch.Tensor:
        """``[1, N, ...]`` packed values as ``[B, T, ...]`` rows, 0 on padding; keeps the
        autograd graph, so a loss on the rows back-propagates into the packed forward."""
        rows, width = self.shape
        trailing = tuple(values.shape[2:])
        flat = values.new_zeros((rows * width, *trailing))
        return flat.index_copy(0, self.token_index, values[0]).view(rows, width, *trailing)


def pack_padded(batch: Mapping[str, Any]) -> PackedRows | None:
    """The batch's rows packed into one, or None when packing would change the result.

    Needs ``input_ids`` and ``attention_mask`` ``[B, T]`` (an InputProcessor's padded
    batch, on either padding side, or one collated alike). None when a row's positions are
    not ``0..n-1`` over its tokens (a packed row, custom positions), or when a row's first
    token carries a label that its padded form would predict from the padding before it.
    """
    mask = batch.get("attention_mask")
    input_ids = batch["input_ids"]
    if mask is None or mask.dim() != 2 or mask.shape != input_ids.shape:
        return None
    mask = mask.bool()
    counted = mask.long().cumsum(1) - 1  # each real token's place in its row
    positions = batch.get("position_ids")
    if positions is not None and not bool((positions[mask] == counted[mask]).all()):
        return None
    labels = batch.get("labels")
    starts = mask & (counted == 0)
    if labels is not None:
        # Column 0 is never predicted, padded or packed; a later first token is predicted
        # from padding when padded, and must not be from the previous sequence when packed.
        later_start = starts.clone()
        later_start[:, 0] = False
        if bool((labels[later_start] != IGNORE_INDEX).any()):
            return None
    token_index = mask.flatten().nonzero().squeeze(1)
    packed_labels = None
    if labels is not None:
        packed_labels = labels.flatten()[token_index].clone()
        packed_labels[starts.flatten()[token_index]] = IGNORE_INDEX
        packed_labels = packed_labels.view(1, -1)
    return PackedRows(
        input_ids=input_ids.flatten()[token_index].view(1, -1),
        position_ids=counted.flatten()[token_index].view(1, -1),
        labels=packed_labels,
        token_index=token_index,
        lengths=mask.sum(1),
        shape=(input_ids.shape[0], input_ids.shape[1]),
    )
