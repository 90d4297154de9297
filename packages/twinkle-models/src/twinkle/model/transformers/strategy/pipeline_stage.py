"""One pipeline stage of a Hugging Face decoder: its run of layers, with the embedding on the
first stage and the final norm and head on the last, and the pruning that leaves each rank
only the modules of its own stages.

The model keeps its own module tree (what peft, FSDP2, tensor parallel and the checkpoints
see); the decoder's layer list becomes a ``ModuleDict`` keyed by the original indices, so
every kept parameter keeps its name (``model.layers.3.mlp...``) and a stage's state dict is
a slice of the whole model's. A ``DecoderChunk`` holds references to the modules it runs and
does what the decoder's ``forward`` does for those layers: the causal mask of each layer type
and the rotary embedding are computed on every stage from the attention mask, which each
stage receives with the micro-batch; only the hidden states travel between stages.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from twinkle.model.families import PipelineLayout

_MASKS = {
    "full_attention": create_causal_mask,
    "sliding_attention": create_sliding_window_causal_mask,
}


class DecoderChunk(nn.Module):
    """Layers ``indices`` of a decoder; ``embed`` on the first stage turns token ids into
    hidden states, ``norm`` and ``head`` on the last turn them into logits."""

    def __init__(
        self,
        config,
        layers: nn.ModuleDict,
        indices: range,
        rotary: nn.Module,
        *,
        embed: nn.Module | None = None,
        norm: nn.Module | None = None,
        head: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.indices = list(indices)
        self.layers = nn.ModuleDict({str(i): layers[str(i)] for i in self.indices})
        # The rotary embedding has no parameters: every chunk computes it (not registered,
        # so FSDP2 does not see it twice).
        object.__setattr__(self, "rotary", rotary)
        self.embed, self.norm, self.head = embed, norm, head

    def forward(self, inputs: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(inputs) if self.embed is not None else inputs
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        types = getattr(self.config, "layer_types", None) or ["full_attention"] * (
            max(self.indices) + 1
        )
        masks = {
            kind: _MASKS[kind](
                config=self.config,
                inputs_embeds=hidden,
                attention_mask=attention_mask,
                cache=None,
                position_ids=positions,
            )
            for kind in {types[i] for i in self.indices}
        }
        rotary = self.rotary(hidden, positions)
        for index in self.indices:
            hidden = self.layers[str(index)](
                hidden,
                attention_mask=masks[types[index]],
                position_embeddings=rotary,
                position_ids=positions,
                use_cache=False,
            )
            if isinstance(hidden, tuple):  # older decoder layers return (hidden, ...)
                hidden = hidden[0]
        if self.head is not None:
            hidden = self.head(self.norm(hidden))
        return hidden


def build_chunks(
    base: nn.Module, layout: PipelineLayout, stages: list[range], mine: list[int]
) -> list[DecoderChunk]:
    """Prune ``base`` (the Hugging Face causal LM, under peft or not) to the modules of this
    rank's stages ``mine`` (indices into ``stages``) and return their chunks, in order.

    The head tied to the embedding becomes a copy of it on the last stage (the first stage
    keeps the embedding): ``PipelinePlan`` sums their gradients before every step, so the two
    copies stay equal, as the one tensor of a single process.
    """
    decoder = base.get_decoder()
    config = base.config.get_text_config()
    last = len(stages) - 1
    head = getattr(base, layout.head)
    embed = getattr(decoder, layout.embed)
    if last in mine and 0 not in mine and head.weight is embed.weight:
        head.weight = nn.Parameter(
            embed.weight.detach().clone(), requires_grad=embed.weight.requires_grad
        )
    kept = {i for s in mine for i in stages[s]}
    layers = nn.ModuleDict(
        {str(i): layer for i, layer in enumerate(getattr(decoder, layout.layers)) if i in kept}
    )
    setattr(decoder, layout.layers, layers)
    if 0 not in mine:
        setattr(decoder, layout.embed, None)
    if last not in mine:
        setattr(decoder, layout.norm, None)
        setattr(base, layout.head, None)
    rotary = getattr(decoder, layout.rotary)
    return [
        DecoderChunk(
            config,
            layers,
            stages[s],
            rotary,
            embed=getattr(decoder, layout.embed) if s == 0 else None,
            norm=getattr(decoder, layout.norm) if s == last else None,
            head=getattr(base, layout.head) if s == last else None,
        )
        for s in mine
    ]
