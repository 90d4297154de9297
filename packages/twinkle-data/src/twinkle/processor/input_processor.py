"""InputProcessor: a batch of InputFeatures in, the model's input tensors out, and back again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from twinkle.data_format import InputFeature
from twinkle.infra import remote_class, remote_function
from twinkle.processor.sequences import IGNORE_INDEX, TokenRow, to_token_rows
from twinkle.utils import Registry

PADDING_SIDES = ("right", "left")


@remote_class(execute="first")
class InputProcessor:
    """Collates the features a DataLoader yields into the tensors a model takes.

    In: a non-empty list of InputFeatures or dicts with ``input_ids`` and
    optional ``labels`` (not shifted: ``labels[i]`` is the target at token
    ``i``) and ``position_ids`` (default ``0..n-1``; a packed feature from
    PackingDataset restarts them at 0 for each sequence inside it, and only
    padding-free mode takes it, since an attention mask cannot keep its
    sequences apart). Features must be unpadded. Labels are on every feature
    or on none (prompts).

    In every mode the label of each sequence's first token becomes -100:
    nothing precedes that token, so no logit predicts it, and a loss that
    shifts labels must not predict it from the previous sequence's last token
    or from padding. PackingDataset makes the same choice.

    ``padding_free`` picks the layout. ``None`` (the default) lets the model choose: the
    batch is padded, and a model whose attention keeps packed sequences apart packs its
    rows into one for the forward (``twinkle.processor.packed_rows``), so the loss, the
    metrics and the outputs still see rows; features that are packed already (from
    PackingDataset) are collated padding-free, as nothing else can hold them. ``True``
    always collates padding-free and ``False`` always pads, the forward included.

    Out, padded (``padding_free`` False or None): ``input_ids`` (padded with
    ``pad_token_id``), ``labels`` (padded with -100), ``attention_mask`` (1 on
    tokens, 0 on padding) and ``position_ids`` (0 on padding), all int64
    ``[B, T]`` and padded on ``padding_side``.

    Out, padding-free (``padding_free=True``): the batch concatenated into one
    row, ``input_ids``, ``labels`` and ``position_ids`` of shape ``[1, total]``
    with positions restarting at 0 for every sequence, and the varlen
    flash-attention kwargs transformers reads (``FlashAttentionKwargs``):
    ``cu_seq_lens_q``/``cu_seq_lens_k`` (int32 cumulative sequence lengths
    from 0 to ``total``) and ``max_length_q``/``max_length_k`` (Python ints,
    as flash-attn wants them). No attention mask: the boundaries are in the
    positions. ``num_pad_tokens`` (int) counts the padding added at the end.

    ``labels`` are for the loss and ``num_pad_tokens`` for ``unpack``; the
    other keys are keyword arguments of a transformers model's ``forward``.
    ``pad_to_multiple_of`` rounds the padded length (or the packed row) up to
    a multiple, as Ulysses sequence parallel needs; in padding-free mode the
    padding is one extra sequence at the end of the row (positions from 0),
    which no real token attends to. ``unpack`` undoes the batching of
    per-token outputs.
    """

    def __init__(
        self,
        padding_side: str = "right",
        pad_token_id: int = 0,
        padding_free: bool | None = None,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        if padding_side not in PADDING_SIDES:
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int) or pad_token_id < 0:
            raise ValueError(f"pad_token_id must be a token id (an int >= 0), got {pad_token_id!r}")
        if padding_free is not None and not isinstance(padding_free, bool):
            raise TypeError(
                f"padding_free must be True, False or None (the model chooses), got "
                f"{padding_free!r}"
            )
        if pad_to_multiple_of is not None and (
            isinstance(pad_to_multiple_of, bool)
            or not isinstance(pad_to_multiple_of, int)
            or pad_to_multiple_of < 1
        ):
            raise ValueError(
                f"pad_to_multiple_of must be None or a positive int, got {pad_to_multiple_of!r}"
            )
        self.padding_side = padding_side
        self.pad_token_id = pad_token_id
        self.padding_free = padding_free
        self.pad_to_multiple_of = pad_to_multiple_of

    @remote_function(dispatch="all", execute="first", collect="first")
    def __call__(
        self, features: Sequence[InputFeature | Mapping[str, Any]]
    ) -> dict[str, torch.Tensor | int]:
        """Pad or pack ``features``; see the class docstring for the keys."""
        return self.collate_fn(features)

    def collate_fn(
        self, features: Sequence[InputFeature | Mapping[str, Any]]
    ) -> dict[str, torch.Tensor | int]:
        """``__call__`` as a plain method, for ``torch.utils.data.DataLoader(collate_fn=...)``:
        a bound method that pickles with its processor into DataLoader worker processes."""
        rows = to_token_rows(features)
        packs = self.padding_free
        if packs is None:
            packs = any(bool((row.position_ids[1:] == 0).any()) for row in rows)
        return self._pack(rows) if packs else self._pad(rows)

    def _round_up(self, length: int) -> int:
        multiple = self.pad_to_multiple_of or 1
        return -(-length // multiple) * multiple

    def _pad(self, rows: list[TokenRow]) -> dict[str, torch.Tensor | int]:
        for index, row in enumerate(rows):
            if bool((row.position_ids[1:] == 0).any()):
                raise ValueError(
                    f"feature {index} is packed (its position_ids restart at 0 inside it), and an "
                    "attention mask cannot keep its sequences apart; collate packed features "
                    "with InputProcessor(padding_free=True) (or None, the default)"
                )
        width = self._round_up(max(row.input_ids.numel() for row in rows))
        device = rows[0].input_ids.device

        def pad(values: torch.Tensor, fill: int) -> torch.Tensor:
            padding = torch.full((width - values.numel(),), fill, dtype=torch.long, device=device)
            pieces = (values, padding) if self.padding_side == "right" else (padding, values)
            return torch.cat(pieces)

        batch = {
            "input_ids": torch.stack([pad(row.input_ids, self.pad_token_id) for row in rows]),
            "attention_mask": torch.stack([pad(torch.ones_like(row.input_ids), 0) for row in rows]),
            "position_ids": torch.stack([pad(row.position_ids, 0) for row in rows]),
        }
        if rows[0].labels is not None:
            batch["labels"] = torch.stack([pad(row.labels, IGNORE_INDEX) for row in rows])
        return batch

    def _pack(self, rows: list[TokenRow]) -> dict[str, torch.Tensor | int]:
        total = sum(row.input_ids.numel() for row in rows)
        num_pad = self._round_up(total) - total
        device = rows[0].input_ids.device
        input_ids = [row.input_ids for row in rows]
        position_ids = [row.position_ids for row in rows]
        labels = [row.labels for row in rows]
        if num_pad:
            input_ids.append(torch.full((num_pad,), self.pad_token_id, device=device))
            position_ids.append(torch.arange(num_pad, device=device))
            labels.append(torch.full((num_pad,), IGNORE_INDEX, device=device))
        positions = torch.cat(position_ids)
        ends = torch.tensor([total + num_pad], device=device)
        cu_seq_lens = torch.cat([(positions == 0).nonzero().flatten(), ends]).to(torch.int32)
        max_length = int(cu_seq_lens.diff().max())
        batch: dict[str, torch.Tensor | int] = {
            "input_ids": torch.cat(input_ids).long().view(1, -1),
            "position_ids": positions.long().view(1, -1),
            "cu_seq_lens_q": cu_seq_lens,
            "cu_seq_lens_k": cu_seq_lens.clone(),
            "max_length_q": max_length,
            "max_length_k": max_length,
            "num_pad_tokens": num_pad,
        }
        if rows[0].labels is not None:
            batch["labels"] = torch.cat(labels).long().view(1, -1)
        return batch

    @remote_function(dispatch="all", execute="first", collect="first")
    def unpack(
        self, per_token_output: torch.Tensor, batch_inputs: Mapping[str, Any]
    ) -> list[torch.Tensor]:
        """Split a per-token output of a batch back into one tensor per sequence, padding dropped.

        ``per_token_output`` is aligned with ``batch_inputs['input_ids']`` on its
        first two dimensions (``[B, T, ...]`` padded, ``[1, total, ...]``
        padding-free): entry ``[b, t]`` belongs to token ``t`` of row ``b``, as
        per-token log-probabilities of the labels are. ``batch_inputs`` is what
        ``__call__`` returned. The result lists the sequences in batch order: one
        per feature, except that a packed feature (padding-free mode) gives one
        per sequence inside it.
        """
        values = torch.as_tensor(per_token_output)
        if "input_ids" not in batch_inputs:
            raise ValueError(
                "batch_inputs must be the dict this InputProcessor's __call__ returned"
            )
        shape = tuple(batch_inputs["input_ids"].shape)
        if tuple(values.shape[:2]) != shape:
            raise ValueError(
                f"per_token_output has shape {tuple(values.shape)} but the batch's input_ids "
                f"have shape {shape}; the output must hold one entry per input token"
            )
        if "cu_seq_lens_q" in batch_inputs:
            bounds = batch_inputs["cu_seq_lens_q"].tolist()
            pieces = [values[0, a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            return pieces[:-1] if batch_inputs.get("num_pad_tokens") else pieces
        if "attention_mask" not in batch_inputs:
            raise ValueError(
                "batch_inputs has neither attention_mask (padded) nor cu_seq_lens_q (padding-free):"
                " pass the dict this InputProcessor's __call__ returned"
            )
        masks = batch_inputs["attention_mask"].to(values.device).bool()
        return [row[mask] for row, mask in zip(values, masks, strict=True)]


INPUT_PROCESSORS: Registry = Registry("input processor", base=InputProcessor)
"""InputProcessors by name, for ``model.set_processor('InputProcessor')``."""
INPUT_PROCESSORS.register(InputProcessor)
