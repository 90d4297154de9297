"""Packed (padding-free) batches for MegatronModel, run as right-padded rows.

``InputProcessor(padding_free=True)`` concatenates the sequences into one row with
``cu_seq_lens_q`` marking their bounds. Megatron reads such a row only through
Transformer Engine's attention (the THD format, ``packed_seq_params``); the local
layer spec's attention refuses it (megatron/core/transformer/dot_product_attention.py,
``assert packed_seq_params is None``). So the row is cut back into one right-padded
row per sequence, the model runs on those, and per-token outputs are put back in the
packed layout. The maths is the packed row's (each sequence attends only to itself,
positions from 0); the padding-free saving of compute is not there without Transformer
Engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from twinkle.loss.base import IGNORE_INDEX

# What the processor adds for flash-attention's varlen kernels; rows do not need it.
VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "num_pad_tokens")


def is_packed(batch: dict[str, Any]) -> bool:
    return "cu_seq_lens_q" in batch


def unpack_rows(
    batch: dict[str, Any], loss_kwargs: dict[str, Any], pad_id: int
) -> tuple[dict[str, Any], dict[str, Any], Callable[[torch.Tensor], torch.Tensor]]:
    """(rows batch, loss arguments, ``repack``): one right-padded row per packed sequence.

    Per-token loss arguments shaped like the packed row (``old_logps``, ...) are cut into
    rows too; per-sequence ones (``advantages``) already have one entry per row.
    ``repack`` turns per-token rows (n, T) back into the packed (1, total) layout.
    """
    input_ids = batch["input_ids"]
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"a packed batch holds one row; this one has {input_ids.shape[0]}: pass what "
            "InputProcessor(padding_free=True) returns"
        )
    bounds = batch["cu_seq_lens_q"].tolist()
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))
    total = input_ids.shape[1]
    if bounds[0] != 0 or bounds[-1] != total:
        raise ValueError(
            f"cu_seq_lens_q runs from {bounds[0]} to {bounds[-1]} but the packed row has "
            f"{total} tokens: the bounds must cover the row from 0"
        )
    longest = max(end - start for start, end in spans)

    def rows_of(packed: torch.Tensor, fill: float) -> torch.Tensor:
        rows = packed.new_full((len(spans), longest, *packed.shape[2:]), fill)
        for row, (start, end) in enumerate(spans):
            rows[row, : end - start] = packed[0, start:end]
        return rows

    out = {k: v for k, v in batch.items() if k not in VARLEN_KEYS}
    out["input_ids"] = rows_of(input_ids, pad_id)
    out["attention_mask"] = rows_of(torch.ones_like(input_ids), 0)
    out["position_ids"] = torch.arange(longest, device=input_ids.device).expand(len(spans), -1)
    if "labels" in batch:
        out["labels"] = rows_of(batch["labels"], IGNORE_INDEX)
    kwargs = {
        k: rows_of(v, 0) if torch.is_tensor(v) and v.shape[:2] == (1, total) else v
        for k, v in loss_kwargs.items()
    }

    def repack(per_token: torch.Tensor) -> torch.Tensor:
        packed = per_token.new_zeros((1, total, *per_token.shape[2:]))
        for row, (start, end) in enumerate(spans):
            packed[0, start:end] = per_token[row, : end - start]
        return packed

    return out, kwargs, repack
