"""Padding-free by default: whether a model runs packed rows exactly, and when it pays.

A batch with padding spends compute on it. Packed into one row (positions restarting at 0
per sequence, no attention mask), the same sequences give the same per-token outputs on a
model whose every sequence mixer keeps them apart:

- full attention whose mask transformers builds in ``masking_utils`` (it reads packed
  sequences from the positions when there is no mask and no cache), or flash attention
  (varlen, from the positions); a custom attention implementation may do either, so it is
  not assumed to;
- GatedDeltaNet linear attention once ``GatedDeltaNetPaddingFreePatch`` runs it through the
  varlen kernels of ``twinkle.kernel``;
- no other layer that carries state along the row (a causal convolution, a recurrence):
  Mamba and short-convolution mixers would leak one sequence into the next.

Whether packing pays is a cost estimate per batch: packing removes the padding's share of
every linear layer, but attention over a dense mask (sdpa, eager) computes the whole
packed row against itself, so long rows of uniform length are cheaper padded. Flash and
flex attention skip the blocks between sequences, and so does ring attention where its
blocks run flash-attention (not on a CPU). A batch runs packed only when the
estimate is below ``PACK_BELOW`` of the padded one; a batch without padding never does.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from torch import nn

from twinkle.model.transformers.strategy.ring_attention import RING_ATTENTION
from twinkle.model.transformers.strategy.ring_attention_flash import has_flash_blocks
from twinkle.model.transformers.strategy.ulysses_attention import WRAPPED as ULYSSES_WRAPPED
from twinkle.patch import GatedDeltaNetPaddingFreePatch
from twinkle.patch.gated_delta_net import is_gated_delta_net
from twinkle.processor import PackedRows, pack_padded
from twinkle.utils import get_logger

logger = get_logger("twinkle.model")

MASKED_ATTENTION = ("sdpa", "eager", "flex_attention")
"""Implementations whose mask comes from ``masking_utils``: packed rows are kept apart there."""
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention", RING_ATTENTION)
"""Implementations that keep packed sequences apart without a mask from ``masking_utils``
(block-sparse or varlen; ring attention masks each block by the row's segments)."""
MASK_BUILDERS = ("create_causal_mask", "create_sliding_window_causal_mask")
PACK_BELOW = 0.95
"""A batch packs when its estimated packed cost is below this share of its padded cost."""


@dataclass(frozen=True)
class PackingSupport:
    """Whether a model runs packed rows exactly; ``reason`` says why, naming its attention."""

    packs: bool
    attention: str
    reason: str


def attention_implementation(model: nn.Module) -> str:
    """The attention that sees the sequences: for Ulysses attention, the one it wraps."""
    config = model.config.get_text_config()
    name = str(getattr(config, "_attn_implementation", None) or "eager")
    return ULYSSES_WRAPPED.get(name, name)


def packing_support(model: nn.Module) -> PackingSupport:
    """Whether the Hugging Face ``model`` (not a peft wrapper) keeps packed sequences apart."""
    attention = attention_implementation(model)
    name = type(model).__name__
    varlen_ready = {  # GatedDeltaNet layers run their convolution varlen once patched
        id(inner)
        for outer in model.modules()
        if is_gated_delta_net(outer)
        for inner in outer.modules()
    }
    stateful = sorted(
        {
            type(module).__name__
            for module in model.modules()
            if isinstance(module, nn.Conv1d | nn.RNNBase) and id(module) not in varlen_ready
        }
    )
    if stateful:
        return PackingSupport(
            False,
            attention,
            f"{name} (attention {attention!r}) has layers that carry state along the row "
            f"({', '.join(stateful)}: a "
            f"causal convolution or recurrence), which would leak one packed sequence into the "
            f"next",
        )
    modeling = sys.modules.get(type(model).__module__)
    builds_masks = any(hasattr(modeling, builder) for builder in MASK_BUILDERS)
    if attention in VARLEN_ATTENTION or (attention in MASKED_ATTENTION and builds_masks):
        linear = GatedDeltaNetPaddingFreePatch().applies_to(model)
        via = "; its linear attention runs the varlen kernels" if linear else ""
        return PackingSupport(
            True, attention, f"{name}'s attention {attention!r} keeps packed sequences apart{via}"
        )
    if attention in MASKED_ATTENTION:
        why = "its modeling code builds its own attention mask, which ignores packed positions"
    else:
        known = ", ".join(dict.fromkeys(MASKED_ATTENTION + VARLEN_ATTENTION))
        why = f"it is not an implementation known to keep packed sequences apart ({known})"
    return PackingSupport(False, attention, f"{name} uses attention {attention!r}: {why}")


def skips_across_sequences(model: nn.Module) -> bool:
    """Whether the attention's cost grows with each packed sequence's length squared
    rather than the row's: flash and flex attention, and ring attention where its blocks
    run flash-attention (on a CPU they compute every pair of a block and mask them)."""
    attention = attention_implementation(model)
    if attention == RING_ATTENTION:
        return has_flash_blocks(next(model.parameters()).device)
    return attention in VARLEN_ATTENTION


@dataclass(frozen=True)
class ForwardCost:
    """Forward FLOPs of the decoder: ``per_token`` through the linear layers, ``per_pair``
    for each (query, key) pair of the full-attention layers; ``varlen``: the attention
    skips pairs across packed sequences."""

    per_token: float
    per_pair: float
    varlen: bool

    @classmethod
    def of(cls, model: nn.Module) -> ForwardCost:
        config = model.config.get_text_config()
        skipped = {
            id(p)
            for m in (model.get_input_embeddings(), model.get_output_embeddings())
            if m is not None
            for p in m.parameters()
        }
        decoder_params = sum(p.numel() for p in model.parameters() if id(p) not in skipped)
        layer_types = getattr(config, "layer_types", None) or []
        attention_layers = sum(kind != "linear_attention" for kind in layer_types) or getattr(
            config, "num_hidden_layers", 1
        )
        heads = getattr(config, "num_attention_heads", 1)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            per_token=2.0 * decoder_params,
            per_pair=4.0 * heads * head_dim * attention_layers,
            varlen=skips_across_sequences(model),
        )

    def saves(self, lengths: list[int], width: int) -> bool:
        """Whether rows of ``lengths`` cost less packed than padded to ``width``."""
        total = sum(lengths)
        pairs = sum(n * n for n in lengths) if self.varlen else total * total
        packed = total * self.per_token + pairs * self.per_pair
        padded = len(lengths) * width * (self.per_token + width * self.per_pair)
        return packed < PACK_BELOW * padded


class AutoPacking:
    """A TransformersModel's padding-free choice: checked once per attention implementation,
    logged once, and applied per batch by ``pack``."""

    def __init__(self) -> None:
        self._support: PackingSupport | None = None
        self._cost: ForwardCost | None = None
        self._logged = False

    def support(self, model: nn.Module) -> PackingSupport:
        if self._support is None or self._support.attention != attention_implementation(model):
            self._support, self._cost = packing_support(model), None
        return self._support

    def require(self, model: nn.Module, why: str) -> None:
        """Raise unless ``model`` runs packed rows; ``why`` says what asked for them."""
        support = self.support(model)
        if not support.packs:
            raise ValueError(
                f"{why}, but {support.reason}. Collate padded batches instead: "
                f"set_processor('InputProcessor', padding_free=False) (or None, the default, "
                f"which pads on this model), and leave packed datasets (PackingDataset) out"
            )

    def pack(self, model: nn.Module, batch: dict, mode: bool | None) -> PackedRows | None:
        """The packed form of a padded ``batch`` when the unit's processor leaves the choice
        to the model (``mode`` None), the model packs exactly and packing computes less."""
        support = self.support(model)
        if not self._logged:
            self._logged = True
            logger.info("%s", _choice(support, mode))
        if mode is not None or not support.packs or "attention_mask" not in batch:
            return None
        mask = batch["attention_mask"]
        if self._cost is None:
            self._cost = ForwardCost.of(model)
        if not self._cost.saves(mask.sum(1).tolist(), mask.shape[1]):
            return None
        return pack_padded(batch)


def _choice(support: PackingSupport, mode: bool | None) -> str:
    if mode is False:
        return "padded batches: the processor was set with padding_free=False"
    if mode is True:
        return (
            f"padding-free batches: the processor was set with padding_free=True; {support.reason}"
        )
    if not support.packs:
        return f"padded batches: {support.reason}"
    return (
        f"padding-free by default: {support.reason}, so a batch with padding runs its forward "
        "as one packed row where that computes less (the loss, metrics and outputs keep their "
        "rows); set_processor('InputProcessor', padding_free=False) always pads"
    )
