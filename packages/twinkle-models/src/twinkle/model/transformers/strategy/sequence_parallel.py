"""Ulysses sequence parallel: each rank of an SP group runs the model on 1/sp of the sequence.

``SequenceParallelConfig`` configures it, ``SequenceParallelStrategy`` wraps its lifecycle
(checked against the DeviceMesh, applied to a model, asked per forward), and
``SequenceParallel`` is the core. Per forward (``shard`` then ``SequenceShard.outputs``):

1. pad the batch to a multiple of ``sp`` (padding is masked out, or is a sequence of its
   own in a packed row) and keep this rank's contiguous slice of the tokens; position_ids
   stay global, so RoPE sees the true positions;
2. build the full-sequence attention masks once (causal, padding, and packed-sequence
   boundaries from the position_ids) with transformers' own mask functions, and hand them
   to the model ready-made, so it never builds masks for its shard;
3. attention layers all-to-all q/k/v to head shards, attend over the full sequence and
   all-to-all back (``ulysses_attention``); linear-attention layers (Qwen3.5
   GatedDeltaNet), whose recurrence needs the whole sequence, gather it, run, and keep
   their slice;
4. each rank scores its shard (the label-token logps) and the logps are gathered, so the
   loss, computed identically on every SP rank from the full (B, T) logps, is exactly the
   single-process loss. Full logits are gathered only when returned without labels
   (``gather_logits``). MoE router logits are gathered the same way
   (``SequenceShard.full_router_logits``), so the load-balancing loss sees the whole sequence.

Gradient contract for the data-parallel strategy: each SP rank ends its backward holding a
partial gradient, and the partials of one SP group sum to the group's full gradient; every
SP rank reports the group's full label-token count. So gradients are summed over all
data-parallel ranks (SP peers included) and divided by the total token count over ranks
divided by ``sp`` (``SequenceParallelStrategy.size``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from transformers import masking_utils

from twinkle.loss.base import IGNORE_INDEX
from twinkle.loss.chunked_logps import chunked_logits_logps
from twinkle.mesh import DeviceMesh
from twinkle.model.transformers.strategy.ulysses_attention import (
    SUPPORTED_INNER,
    register_ulysses_attention,
)
from twinkle.model.transformers.strategy.ulysses_comm import gather_sequence
from twinkle.model.transformers.strategy.ulysses_linear import gather_linear_attention
from twinkle.utils import get_logger

logger = get_logger("twinkle.model")

SP_ATTRIBUTE = "twinkle_sequence_parallel"
MASK_FUNCTIONS = {
    "full_attention": masking_utils.create_causal_mask,
    "sliding_attention": masking_utils.create_sliding_window_causal_mask,
    "linear_attention": masking_utils.create_recurrent_attention_mask,
}


@dataclass
class SequenceParallelConfig:
    """``ulysses_size`` defaults to the DeviceMesh's; ``gather_logits`` gathers full-vocabulary
    logits when a forward without labels returns them (otherwise each rank gets the logits
    of its own shard). With labels the per-token logps are always gathered."""

    enabled: bool = True
    ulysses_size: int | None = None
    gather_logits: bool = True


def _hf_model(model: nn.Module) -> nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _my_group(groups: list[list[int]]) -> dist.ProcessGroup:
    """Create every group (all ranks must call ``new_group`` for each) and return ours."""
    rank, mine = dist.get_rank(), None
    for ranks in groups:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine


def _unsplittable_heads(text_config, size: int) -> str | None:
    """Why Ulysses cannot split the model's heads over ``size`` ranks; None when it can."""
    for name in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(text_config, name, None)
        if heads is not None and heads % size:
            return f"ulysses_size={size} must divide the model's {name}={heads}"
    return None


def _check_heads(text_config, size: int) -> None:
    why = _unsplittable_heads(text_config, size)
    if why is not None:
        raise ValueError(
            f"{why}: Ulysses splits attention heads across the SP group. Pick a ulysses_size "
            "that divides it, or use SequenceParallelStrategy, which falls back to ring "
            "attention"
        )


@dataclass
class PaddedRows:
    """A batch padded to a multiple of the ranks that split it: padding is masked out of a
    padded row and is a sequence of its own in a packed one (positions from 0; ``bounds``,
    the packed row's cu_seq_lens, gets it as one more sequence). ``length`` is the
    unpadded one; position_ids default to 0..T-1 as transformers' do."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    labels: torch.Tensor | None
    bounds: torch.Tensor | None
    length: int

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    @classmethod
    def of(cls, batch: dict, multiple: int) -> PaddedRows:
        input_ids = batch["input_ids"]
        batch_size, length = input_ids.shape
        pad = -length % multiple
        mask, labels = batch.get("attention_mask"), batch.get("labels")
        positions = batch.get("position_ids")
        if positions is None:
            positions = torch.arange(length, device=input_ids.device).expand(batch_size, -1)
        bounds = batch.get("cu_seq_lens_q")
        if pad:
            input_ids = nn.functional.pad(input_ids, (0, pad))
            tail = torch.arange(pad, device=positions.device).expand(batch_size, -1)
            if mask is not None:
                tail = tail + positions[:, -1:] + 1
                mask = nn.functional.pad(mask, (0, pad))
            positions = torch.cat([positions, tail], dim=1)
            if labels is not None:
                labels = nn.functional.pad(labels, (0, pad), value=IGNORE_INDEX)
            if bounds is not None:
                bounds = torch.cat([bounds, bounds.new_tensor([length + pad])])
        return cls(input_ids, positions, mask, labels, bounds, length)


class SequenceShard:
    """One forward's shard: what ``outputs`` needs to turn local logits into full outputs.

    ``positions`` are the padded row's positions this rank ran (default: its contiguous
    slice, Ulysses' split); ``order`` is the index that puts an all-gather of every rank's
    pieces back in sequence order (default: the pieces are in order already). Context
    parallel's zigzag split sets both."""

    def __init__(
        self,
        sp: SequenceSplit,
        batch_size: int,
        length: int,
        labels: torch.Tensor | None,
        positions: torch.Tensor | None = None,
        order: torch.Tensor | None = None,
    ) -> None:
        self.sp, self.batch_size, self.length, self.labels = sp, batch_size, length, labels
        self.positions, self.order = positions, order

    def _gather(self, local: torch.Tensor) -> torch.Tensor:
        """Every rank's (B, T_local, ...) pieces as the (B, T_padded, ...) row, in order."""
        gathered = gather_sequence(local, 1, self.sp.group)
        return gathered if self.order is None else gathered.index_select(1, self.order)

    def outputs(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{'logits'}`` without labels; else ``{'logps', 'pred_ids'}`` (B, T) aligned
        with the labels, as the model's single-process forward returns them."""
        sp = self.sp
        if self.labels is None:
            if sp.config.gather_logits:
                logits = self._gather(logits)[:, : self.length]
            return {"logits": logits.float()}
        # logits[:, t] predicts the label of the next token: score against labels shifted by one.
        shifted = torch.nn.functional.pad(self.labels[:, 1:], (0, 1), value=IGNORE_INDEX)
        if self.positions is None:
            start = sp.rank * logits.shape[1]
            targets_local = shifted[:, start : start + logits.shape[1]]
        else:
            targets_local = shifted[:, self.positions]
        rows, cols = (targets_local != IGNORE_INDEX).nonzero(as_tuple=True)
        logps, ids = chunked_logits_logps(logits, rows, cols, targets_local[rows, cols])
        local_logps = logits.new_zeros(targets_local.shape, dtype=logps.dtype)
        local_logps = local_logps.index_put((rows, cols), logps)
        local_ids = torch.full_like(targets_local, IGNORE_INDEX).index_put((rows, cols), ids)
        next_logps, next_ids = self._gather(local_logps), self._gather(local_ids)
        # Back to label alignment: position t holds log p(labels[t] | tokens < t).
        logps = torch.nn.functional.pad(next_logps[:, : self.length - 1], (1, 0))
        pred_ids = torch.nn.functional.pad(
            next_ids[:, : self.length - 1], (1, 0), value=IGNORE_INDEX
        )
        return {"logps": logps, "pred_ids": pred_ids}

    def full_router_logits(self, router_logits: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each layer's (B * T_shard, E) router logits gathered into (B * T, E) for the whole
        sequence, the split's padding dropped, so the MoE load-balancing loss computed from
        them on every SP rank is the single-process one. The gather's backward keeps this
        rank's slice: the identical loss on ``sp`` ranks is counted once (module docstring)."""
        full = []
        for layer in router_logits:
            shard = layer.shape[0] // self.batch_size
            rows = layer.reshape(self.batch_size, shard, layer.shape[-1])
            rows = self._gather(rows)[:, : self.length]
            full.append(rows.reshape(-1, layer.shape[-1]))
        return full


class SequenceSplit:
    """What Ulysses (``SequenceParallel``) and ring attention (``context_parallel.
    ContextParallel``) set up alike: the group of ranks that splits each sequence (this rank
    is ``rank`` of ``size``), the config, and the model's text config and attention layer
    types (``layer_types``, sorted; a model without them is all full attention)."""

    def __init__(
        self, model: nn.Module, group: dist.ProcessGroup, config: SequenceParallelConfig
    ) -> None:
        self.config, self.group = config, group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.text_config = _hf_model(model).config.get_text_config()
        types = getattr(self.text_config, "layer_types", None) or ["full_attention"]
        self.layer_types = sorted(set(types))


class SequenceParallel(SequenceSplit):
    """Ulysses SP over one group of ranks: patches the model's attention, then pads, splits
    and gathers each batch. Set up on a model by ``SequenceParallelStrategy.apply``."""

    def __init__(
        self, model: nn.Module, group: dist.ProcessGroup, config: SequenceParallelConfig
    ) -> None:
        super().__init__(model, group, config)
        hf, text_config = _hf_model(model), self.text_config
        _check_heads(text_config, self.size)
        inner = hf.config._attn_implementation
        unknown = set(self.layer_types) - set(MASK_FUNCTIONS)
        if unknown:
            raise NotImplementedError(
                f"Ulysses sequence parallel does not know layer types {sorted(unknown)}; "
                f"it handles {sorted(MASK_FUNCTIONS)}"
            )
        if inner not in SUPPORTED_INNER:
            raise NotImplementedError(
                f"Ulysses sequence parallel wraps sdpa or eager attention; this model uses "
                f"{inner!r}. Load it with attn_implementation='sdpa'"
            )
        # The masks are built for the inner attention (sdpa: boolean, eager: additive).
        self.mask_config = copy.copy(text_config)
        self.mask_config._attn_implementation = inner
        hf.set_attn_implementation(register_ulysses_attention(inner, group))
        if "linear_attention" in self.layer_types:
            gather_linear_attention(hf, group)

    def _masks(self, embed_dtype, batch_size, length, attention_mask, position_ids):
        shape_probe = torch.empty(
            (batch_size, length, 0), dtype=embed_dtype, device=position_ids.device
        )
        masks = {
            kind: MASK_FUNCTIONS[kind](
                config=self.mask_config,
                inputs_embeds=shape_probe,
                attention_mask=attention_mask,
                cache=None,
                position_ids=position_ids,
            )
            for kind in self.layer_types
        }
        # Models with one layer type take the mask itself; hybrid ones take the mapping.
        return masks["full_attention"] if list(masks) == ["full_attention"] else masks

    def shard(
        self, batch: dict, embed_dtype: torch.dtype = torch.float32
    ) -> tuple[dict, SequenceShard]:
        """This rank's model inputs for ``batch`` (input_ids, position_ids, full masks; for a
        packed row also its cu_seq_lens) and the shard that turns its logits into outputs."""
        rows = PaddedRows.of(batch, self.size)
        full = rows.input_ids.shape[1]
        local = slice(self.rank * full // self.size, (self.rank + 1) * full // self.size)
        inputs = {
            "input_ids": rows.input_ids[:, local],
            "position_ids": rows.position_ids[:, local],
            "attention_mask": self._masks(
                embed_dtype, rows.batch_size, full, rows.attention_mask, rows.position_ids
            ),
        }
        if rows.bounds is not None:
            # Varlen kernels of gathered linear-attention layers see the full padded row.
            longest = int(rows.bounds.diff().max())
            inputs.update(
                cu_seq_lens_q=rows.bounds,
                cu_seq_lens_k=rows.bounds,
                max_length_q=longest,
                max_length_k=longest,
            )
        return inputs, SequenceShard(self, rows.batch_size, rows.length, rows.labels)


class SequenceParallelStrategy:
    """The Ulysses SP lifecycle on one model, the part a model's training path talks to.

    Built from the DeviceMesh and a ``SequenceParallelConfig`` (checked against each other
    here); ``apply(model)`` makes the SP groups and sets ``SequenceParallel`` (the pad /
    split / gather core) up on the model's attention, and keeps the strategy on the model,
    where ``sequence_parallel_of(model)`` finds it; then, per forward, ``shard(batch)`` gives
    this rank's inputs, and ``rank``/``size`` tell the step how the SP peers count (one of
    them reports a batch's metrics; the token count is divided by ``size``).
    """

    def __init__(
        self, device_mesh: DeviceMesh, config: SequenceParallelConfig | None = None
    ) -> None:
        self.config = config or SequenceParallelConfig()
        self.device_mesh = device_mesh
        self.size = device_mesh.size(self.dim)
        self._check_config()
        self._core: SequenceSplit | None = None

    dim = "ulysses"
    """The mesh dimension whose groups split a sequence."""
    name = "Ulysses sequence parallel"

    def _check_config(self) -> None:
        """The config's ``ulysses_size``, where set, is the mesh's."""
        if self.config.ulysses_size is not None and self.config.ulysses_size != self.size:
            raise ValueError(
                f"SequenceParallelConfig(ulysses_size={self.config.ulysses_size}) differs from "
                f"the DeviceMesh's ulysses_size={self.device_mesh.ulysses_size}; set it on the "
                f"mesh (DeviceMesh.from_sizes(ulysses_size=...)) and leave the config's as None"
            )

    @property
    def active(self) -> bool:
        """Whether SP runs at all: enabled in the config and ulysses_size > 1."""
        return self.config.enabled and self.size > 1

    def apply(self, model: nn.Module) -> SequenceParallelStrategy | None:
        """Set SP up on ``model`` (a Hugging Face or peft model); returns the strategy, or
        None when it is not ``active`` (the model is left as it is)."""
        if not self.active:
            return None
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                f"{self.name} needs torch.distributed: launch with torchrun and call "
                "twinkle.initialize() (or init_process_group) before building the model"
            )
        if dist.get_world_size() != self.device_mesh.world_size:
            raise ValueError(
                f"the DeviceMesh has {self.device_mesh.world_size} ranks but torch.distributed "
                f"has {dist.get_world_size()}; size the mesh to the launched processes"
            )
        group = _my_group(self.device_mesh.group_ranks(self.dim))
        self._core = self._build_core(model, group)
        # Kept on the model too, so its wrapper finds it whatever strategy wraps the model.
        setattr(_hf_model(model), SP_ATTRIBUTE, self)
        return self

    def _build_core(self, model: nn.Module, group: dist.ProcessGroup):
        """Ulysses on ``model`` over ``group``; where it cannot split the attention heads (they
        do not divide the group, or there are fewer than its ranks), ring attention over the
        same group instead (``context_parallel.ContextParallel``), which splits no heads."""
        why = _unsplittable_heads(_hf_model(model).config.get_text_config(), self.size)
        if why is None:
            return SequenceParallel(model, group, self.config)
        from twinkle.model.transformers.strategy.context_parallel import ContextParallel

        logger.info("%s to split its heads; ring attention over the SP group instead", why)
        try:
            return ContextParallel(model, group, self.config)
        except NotImplementedError as exc:
            raise NotImplementedError(
                f"{why} to split its heads, and the fallback, ring attention, does not run "
                f"this model: {exc}"
            ) from exc

    def _applied(self) -> SequenceSplit:
        if self._core is None:
            raise RuntimeError("SequenceParallelStrategy.apply(model) has not run yet")
        return self._core

    @property
    def group(self) -> dist.ProcessGroup:
        """This rank's SP group."""
        return self._applied().group

    @property
    def rank(self) -> int:
        """This rank's position in its SP group: which slice of the sequence it runs."""
        return self._applied().rank

    def shard(
        self, batch: dict, embed_dtype: torch.dtype = torch.float32
    ) -> tuple[dict, SequenceShard]:
        """This rank's model inputs for ``batch`` and the shard that turns its logits into
        the full outputs (``SequenceParallel.shard``)."""
        return self._applied().shard(batch, embed_dtype)


def sequence_parallel_of(model: nn.Module) -> SequenceParallelStrategy | None:
    """The ``SequenceParallelStrategy`` applied to ``model`` (Hugging Face or peft), if any."""
    return getattr(_hf_model(model), SP_ATTRIBUTE, None)
