"""Depthwise causal 1-D convolution over packed sequences (the short convolution in front of
GatedDeltaNet's linear attention), as a torch reference and a dispatcher.

Each sequence is convolved as if it stood alone: a token sees the ``W - 1`` tokens before
it in its own sequence and zeros before that sequence's start, never the tail of the
previous sequence of the row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from twinkle.kernel import registry
from twinkle.kernel.varlen import check_cu_seqlens, token_offsets

OP = "causal_conv1d"
ACTIVATIONS = (None, "silu", "swish")


def torch_causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x`` ``[B, T, D]``, ``weight`` ``[D, W]``, ``bias`` ``[D]``; returns ``[B, T, D]``.

    With ``cu_seqlens`` (``[N + 1]``), ``B`` must be 1 and the row holds N sequences.
    Computed in ``weight``'s dtype, returned in ``x``'s, as transformers does.
    """
    _check(x, weight, bias, activation)
    batch, length, _ = x.shape
    if cu_seqlens is None:
        offsets = torch.arange(length, device=x.device).expand(batch, length)
    else:
        if batch != 1:
            raise ValueError(
                f"with cu_seqlens the sequences are packed into one row, but x has {batch} rows"
            )
        offsets = token_offsets(check_cu_seqlens(cu_seqlens, length), length).view(1, length)
    hidden = x.to(weight.dtype)
    width = weight.shape[1]
    out = torch.zeros_like(hidden)
    for tap in range(width):
        lag = width - 1 - tap  # tap i of the kernel reads the token `lag` steps back
        shifted = F.pad(hidden, (0, 0, lag, 0))[:, :length] if lag else hidden
        inside = (offsets >= lag).unsqueeze(-1).to(hidden.dtype)
        out = out + shifted * inside * weight[:, tap]
    if bias is not None:
        out = out + bias
    if activation is not None:
        out = F.silu(out)
    return out.to(x.dtype)


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    cu_seqlens: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """:func:`torch_causal_conv1d`, or a fast path for ``x``'s device (see ``registry``)."""
    implementation = registry.select(OP, x.device, backend)
    return implementation(x, weight, bias, activation=activation, cu_seqlens=cu_seqlens)


def _check(x, weight, bias, activation) -> None:
    if x.dim() != 3:
        raise ValueError(f"x must be [batch, tokens, channels], got shape {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"weight must be [channels={x.shape[-1]}, width], got shape {tuple(weight.shape)}"
        )
    if bias is not None and tuple(bias.shape) != (x.shape[-1],):
        raise ValueError(f"bias must be [channels={x.shape[-1]}], got {tuple(bias.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


registry.register_reference(OP, torch_causal_conv1d)
