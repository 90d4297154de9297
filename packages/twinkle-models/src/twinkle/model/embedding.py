"""Embedding training: one vector per sequence from a batch's last hidden states.

Sequences are found in the batch layouts ``InputProcessor`` produces, so the same pooling
serves every collation:

* padded rows ``(B, T)`` with ``attention_mask``, padded on the right or the left: one
  sequence per row, its tokens where the mask is 1;
* padding-free rows ``(1, total)``: one sequence per ``cu_seq_lens_q`` span, or, without it,
  per run of ``position_ids`` restarting at 0; the ``num_pad_tokens`` at the end of the row
  are padding, not a sequence.

Embeddings come out in row-major order (row by row, left to right), which is the order of
the features, and of the packed sequences inside a packed feature.

Poolings (``POOLINGS``):

* ``'last'`` (the default): the hidden state of each sequence's last real token. In a causal
  decoder it is the only token that has attended to the whole sequence.
* ``'mean'``: the mean over the sequence's tokens, in float32; bidirectional encoders trained
  as sentence embedders (all-MiniLM, for one) were trained with it.
* ``'cls'``: the sequence's first token, as BERT's ``[CLS]`` pooling.

Group labels: ``InfonceLoss`` and ``EmbeddingMetric`` read ``labels`` (N,), 1 on each
group's anchor and 0 on its positive and hard negatives (``twinkle.loss.embedding``). A
feature carries its flag under ``EMBEDDING_LABEL_KEY`` (an int, or a list with one flag per
sequence packed inside it); ``group_labels`` collects them in batch order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import torch

POOLINGS = ("last", "mean", "cls")
EMBEDDING_LABEL_KEY = "embedding_label"


def check_pooling(pooling: str) -> str:
    """``pooling`` if it is one of ``POOLINGS``, else a ValueError that lists them."""
    if pooling not in POOLINGS:
        raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")
    return pooling


class SequenceBounds(NamedTuple):
    """Boolean ``(B, T)`` masks of a batch's real tokens and of each sequence's first and last
    token; ``starts`` and ``ends`` each hold exactly one True per sequence."""

    valid: torch.Tensor
    starts: torch.Tensor
    ends: torch.Tensor

    @property
    def num_sequences(self) -> int:
        return int(self.ends.sum())

    def packed(self) -> bool:
        """Whether some row holds more than one sequence."""
        return bool((self.ends.sum(dim=-1) > 1).any())


def sequence_bounds(batch: Mapping[str, Any]) -> SequenceBounds:
    """Where the sequences of a collated batch lie; see the module docstring for the layouts."""
    input_ids = batch["input_ids"]
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}")
    rows, width = input_ids.shape
    device = input_ids.device
    valid = torch.ones(rows, width, dtype=torch.bool, device=device)
    if batch.get("attention_mask") is not None:
        valid = _shaped(batch["attention_mask"], "attention_mask", input_ids).bool()
    num_pad = int(batch.get("num_pad_tokens") or 0)
    if num_pad:
        if rows != 1:
            raise ValueError(
                f"num_pad_tokens belongs to a padding-free batch (one row), but input_ids has "
                f"{rows} rows"
            )
        valid[:, width - num_pad :] = False

    cu_seq_lens = batch.get("cu_seq_lens_q")
    if cu_seq_lens is not None:
        starts, ends = _from_cu_seq_lens(cu_seq_lens, rows, width, num_pad, device)
    else:
        restart = torch.zeros_like(valid)
        if batch.get("position_ids") is not None:
            restart = _shaped(batch["position_ids"], "position_ids", input_ids) == 0
        before = torch.nn.functional.pad(valid, (1, 0))[:, :-1]  # token t-1 is real
        after = torch.nn.functional.pad(valid, (0, 1))[:, 1:]  # token t+1 is real
        next_restart = torch.nn.functional.pad(restart, (0, 1), value=True)[:, 1:]
        starts = valid & (~before | restart)
        ends = valid & (~after | next_restart)

    runs = (valid & ~torch.nn.functional.pad(valid, (1, 0))[:, :-1]).sum(dim=-1)
    bad = (runs != 1).nonzero().flatten().tolist()
    if bad:
        raise ValueError(
            f"rows {bad} of the batch do not hold one contiguous run of real tokens (an "
            "attention_mask row that is all zeros, or has zeros between tokens); collate the "
            "batch with InputProcessor"
        )
    return SequenceBounds(valid, starts, ends)


def _shaped(value: Any, name: str, input_ids: torch.Tensor) -> torch.Tensor:
    tensor = torch.as_tensor(value, device=input_ids.device)
    if tensor.shape != input_ids.shape:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)} but input_ids has "
            f"{tuple(input_ids.shape)}; they must match"
        )
    return tensor


def _from_cu_seq_lens(
    cu_seq_lens: Any, rows: int, width: int, num_pad: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    bounds = torch.as_tensor(cu_seq_lens, device=device).long()
    if rows != 1:
        raise ValueError(f"cu_seq_lens_q belongs to a padding-free batch (one row), got {rows}")
    ok = bounds.ndim == 1 and bounds.numel() >= 2 and bounds[0] == 0 and bounds[-1] == width
    if not ok or not bool((bounds.diff() > 0).all()):
        raise ValueError(
            f"cu_seq_lens_q must rise strictly from 0 to the row length {width}, got "
            f"{bounds.tolist()}"
        )
    if num_pad:
        bounds = bounds[:-1]  # the last span is the padding sequence
        if int(bounds[-1]) != width - num_pad:
            raise ValueError(
                f"cu_seq_lens_q {bounds.tolist()} does not end the real tokens at "
                f"{width - num_pad}: num_pad_tokens={num_pad} must be the last span"
            )
    starts = torch.zeros(rows, width, dtype=torch.bool, device=device)
    ends = torch.zeros_like(starts)
    starts[0, bounds[:-1]] = True
    ends[0, bounds[1:] - 1] = True
    return starts, ends


def pool(
    hidden_states: torch.Tensor, bounds: SequenceBounds, pooling: str = "last"
) -> torch.Tensor:
    """One embedding per sequence, ``(N, H)`` in row-major order, from ``(B, T, H)`` states and
    the batch's ``sequence_bounds``."""
    check_pooling(pooling)
    if hidden_states.ndim != 3 or hidden_states.shape[:2] != bounds.valid.shape:
        raise ValueError(
            f"hidden_states must be (batch, tokens, hidden) matching input_ids "
            f"{tuple(bounds.valid.shape)}, got {tuple(hidden_states.shape)}"
        )
    if pooling == "last":
        return hidden_states[bounds.ends]
    if pooling == "cls":
        return hidden_states[bounds.starts]
    sequence = (bounds.starts.flatten().cumsum(0) - 1)[bounds.valid.flatten()]
    tokens = hidden_states.flatten(0, 1)[bounds.valid.flatten()].float()
    sums = tokens.new_zeros(bounds.num_sequences, tokens.shape[-1]).index_add(0, sequence, tokens)
    counts = torch.bincount(sequence, minlength=bounds.num_sequences)
    return sums / counts[:, None]


def group_labels(features: Iterable[Any]) -> torch.Tensor | None:
    """The ``(N,)`` group flags carried by ``features`` in order, or None when none carries
    one; a packed feature carries a list with one flag per sequence inside it."""
    flags = [feature.get(EMBEDDING_LABEL_KEY) for feature in features]
    missing = [i for i, flag in enumerate(flags) if flag is None]
    if len(missing) == len(flags):
        return None
    if missing:
        raise ValueError(
            f"features {missing} have no {EMBEDDING_LABEL_KEY!r} but others do: give every "
            f"feature its flag, 1 for a group's anchor and 0 for its positive and negatives"
        )
    return torch.cat([torch.as_tensor(flag, dtype=torch.long).reshape(-1) for flag in flags])
