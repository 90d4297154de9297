"""Context parallel for TransformersModel: each rank of a cp group runs its zigzag chunks of the
sequence, and attention is ring attention over the group.

``ContextParallelStrategy`` is built from the DeviceMesh's ``cp`` dimension (and
``SequenceParallelConfig``); ``ContextParallel`` is the core, also Ulysses' fallback when the
attention heads do not split over its group (``SequenceParallelStrategy``). Per forward
(``shard`` then ``SequenceShard.outputs``):

1. pad the batch to a multiple of 2 × cp (masked out, or a sequence of its own in a packed
   row) and keep this rank's chunks r and 2 × cp - 1 - r (``twinkle.model.zigzag``), with
   their global position_ids, so RoPE sees the true positions;
2. hand the model a ``RingLayout`` (the ring, and the whole row's segment ids: padding or
   packed sequences) as the ``ring_layout`` keyword, which transformers passes to every
   attention call; no attention mask is built, for the shard or the whole row;
3. attention layers run ``ring_attention`` (registered with transformers' AttentionInterface):
   key/value blocks go round the ring and the partial results merge by their log-sum-exp;
4. the logps of each rank's tokens are gathered and put back in sequence order, so the loss,
   the same on every cp rank, is the single-process one; the gradient contract is Ulysses'
   (each rank holds a partial gradient, partials of a cp group sum to the whole; every rank
   reports the group's token count, divided by ``size`` in the normaliser).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from transformers import AttentionInterface

from twinkle.model.transformers.strategy.ring_attention import (
    RING_ATTENTION,
    RingLayout,
    ring_attention,
    segments_of,
)
from twinkle.model.transformers.strategy.sequence_parallel import (
    PaddedRows,
    SequenceParallelConfig,
    SequenceParallelStrategy,
    SequenceShard,
    SequenceSplit,
    _hf_model,
)
from twinkle.model.zigzag import sequence_chunks, sequence_order


def _bounds_segments(bounds: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """(B, T) segment ids from cu_seq_lens over the flattened rows."""
    tokens = torch.arange(shape[0] * shape[1], device=bounds.device)
    return torch.bucketize(tokens, bounds[1:], right=True).reshape(shape)


class ContextParallel(SequenceSplit):
    """Ring attention over one group of ranks: registers it as the model's attention, then
    pads, splits (zigzag) and gathers each batch."""

    def __init__(
        self, model: nn.Module, group: dist.ProcessGroup, config: SequenceParallelConfig
    ) -> None:
        super().__init__(model, group, config)
        others = [kind for kind in self.layer_types if kind != "full_attention"]
        if others:
            raise NotImplementedError(
                "ring attention runs models whose layers are all full attention; this one has "
                f"{others} layers. Use Ulysses (ulysses_size dividing the heads) for it"
            )
        AttentionInterface.register(RING_ATTENTION, ring_attention)
        _hf_model(model).set_attn_implementation(RING_ATTENTION)

    def shard(
        self, batch: dict, embed_dtype: torch.dtype = torch.float32
    ) -> tuple[dict, SequenceShard]:
        """This rank's model inputs for ``batch`` (its chunks' input_ids and position_ids,
        the ring layout) and the shard that turns its logits into the batch's outputs."""
        length, blocks = batch["input_ids"].shape[1], 2 * self.size
        if length < blocks:
            raise ValueError(
                f"context parallel over {self.size} ranks cuts each row into 2 × {self.size} "
                f"= {blocks} blocks, but this batch's rows have {length} tokens; give rows of "
                f"at least {blocks} tokens or a smaller cp_size"
            )
        rows = PaddedRows.of(batch, blocks)
        full, device = rows.input_ids.shape[1], rows.input_ids.device
        if rows.bounds is not None:
            segments = _bounds_segments(rows.bounds, rows.input_ids.shape)
        else:
            segments = segments_of(rows.attention_mask, rows.position_ids)
        local = sequence_chunks(full, self.size, self.rank, device)
        inputs = {
            "input_ids": rows.input_ids[:, local],
            "position_ids": rows.position_ids[:, local],
            "ring_layout": RingLayout(self.group, self.size, self.rank, segments),
        }
        order = sequence_order(full, self.size, device)
        part = SequenceShard(self, rows.batch_size, rows.length, rows.labels, local, order)
        return inputs, part


class ContextParallelStrategy(SequenceParallelStrategy):
    """Context parallel's lifecycle, as ``SequenceParallelStrategy`` is Ulysses': over the
    mesh's ``cp`` groups, with ``ContextParallel`` as the core."""

    dim = "cp"
    name = "context parallel"

    def _check_config(self) -> None:
        """Nothing to check: the cp size is the mesh's alone (``ulysses_size`` is Ulysses')."""

    def _build_core(self, model: nn.Module, group: dist.ProcessGroup) -> ContextParallel:
        return ContextParallel(model, group, self.config)
