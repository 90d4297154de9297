"""Linear-attention layers under Ulysses SP: gather the sequence, run, keep this rank's slice.

A GatedDeltaNet (Qwen3.5, Qwen3-Next) carries a recurrent state from the first token to
the last, so a sequence shard cannot be run alone. Each rank gathers the full sequence,
runs the layer on it (with the full-sequence padding mask and, for packed rows, the
full-row cu_seq_lens at which twinkle.patch's varlen kernels reset the state) and keeps
its own slice. The layer's compute is repeated on every SP rank; the rest of the model
stays sharded. Hooks, not a replaced forward, so a patch that later replaces the layer's
forward (the padding-free one) still runs inside the gather.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from twinkle.model.transformers.strategy.ulysses_comm import gather_sequence


def _gather_input(group: dist.ProcessGroup):
    def hook(module, args, kwargs):
        # Every rank keeps a different slice of the output: gradients sum over ranks.
        if args:
            args = (gather_sequence(args[0], 1, group, reduce_grads=True), *args[1:])
        else:
            hidden = kwargs["hidden_states"]
            kwargs = {**kwargs, "hidden_states": gather_sequence(hidden, 1, group, True)}
        return args, kwargs

    return hook


def _keep_slice(group: dist.ProcessGroup):
    rank, size = dist.get_rank(group), dist.get_world_size(group)

    def hook(module, args, output):
        return output.chunk(size, dim=1)[rank]

    return hook


def gather_linear_attention(model: nn.Module, group: dist.ProcessGroup) -> int:
    """Make every decoder layer's ``linear_attn`` run on the gathered sequence; returns how
    many layers were changed."""
    layers = [getattr(m, "linear_attn", None) for m in model.modules()]
    layers = [layer for layer in layers if isinstance(layer, nn.Module)]
    for layer in layers:
        layer.register_forward_pre_hook(_gather_input(group), with_kwargs=True)
        layer.register_forward_hook(_keep_slice(group))
    return len(layers)
