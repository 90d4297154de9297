"""Per-token log-probabilities of the label tokens, from whatever the model produced.

Every token-level loss reads its ``logps`` through ``token_logps``, so a model can hand a
loss any of three forms in ``outputs`` (first match wins):

1. ``logps`` (B, T), already aligned with labels: used as given;
2. ``logits`` (B, T, V): float32 log-softmax of the label rows, a chunk at a time, so
   beyond the logits and their gradient only one chunk of temporaries exists;
3. ``hidden_states`` (B, T, H) with ``lm_head_weight`` (V, H) and optionally
   ``lm_head_bias`` (V,): logits are computed chunk by chunk and never exist in full
   (``chunked_logps``). The head must be a plain linear layer: no logit scaling or soft
   capping, no adapter on it.

Only positions holding a label token get a log-softmax (form 2) or logits at all (form 3),
which alone saves most of the memory on prompt-heavy RL batches. ``prefers_chunked`` tells
a model when to pass form 3 instead of form 2; call ``chunked_logps`` (or the loss) inside
the same autocast context as the model so the head matmul runs in the autocast dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from twinkle.kernel import fast_path
from twinkle.loss.base import IGNORE_INDEX
from twinkle.loss.chunked_logps import (
    chunked_linear_logps,
    chunked_logits_logps,
    dense_logits_logps,
    matmul_dtype,
)
from twinkle.loss.fields import compute_dtype, label_mask

PLAIN_LOGITS_LIMIT_BYTES = 2**30


class TokenLogps(NamedTuple):
    """``logps`` (B, T): log p(labels[b, t] | tokens < t), 0 off the labels, differentiable.
    ``predicted_ids`` (B, T): the argmax token of the logits that predict position t,
    ``IGNORE_INDEX`` off the labels (so ``predicted_ids == labels`` on label tokens is
    next-token accuracy); None when the model gave logps only."""

    logps: torch.Tensor
    predicted_ids: torch.Tensor | None


def prefers_chunked(
    num_tokens: int, vocab_size: int, limit_bytes: int = PLAIN_LOGITS_LIMIT_BYTES
) -> bool:
    """Whether a model should pass hidden states (chunked logits) rather than full logits:
    True when the float32 logits of ``num_tokens`` positions (all B x T of them, which is
    what the plain forward computes) would exceed ``limit_bytes`` (1 GiB by default).
    Below that the plain path is faster (three head matmuls instead of four) and its memory
    is small next to the model's."""
    return num_tokens * vocab_size * 4 > limit_bytes


def _label_positions(
    labels: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows, token positions and target ids of the label tokens."""
    rows, cols = label_mask(labels, ignore_index).nonzero(as_tuple=True)
    return rows, cols, labels[rows, cols]


def _check_targets(targets: torch.Tensor, vocab_size: int) -> None:
    if not targets.numel():
        return
    low, high = (int(v) for v in torch.aminmax(targets))  # one pass, one device sync
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"label ids must lie in [0, {vocab_size}) (the vocabulary), got values from "
            f"{low} to {high}; mark positions outside the loss with -100"
        )


def _scatter(
    rows: torch.Tensor,
    cols: torch.Tensor,
    logps: torch.Tensor,
    ids: torch.Tensor,
    shape: torch.Size,
) -> TokenLogps:
    full = logps.new_zeros(shape).index_put((rows, cols), logps)
    predicted = torch.full(shape, IGNORE_INDEX, dtype=torch.long, device=ids.device)
    return TokenLogps(full, predicted.index_put((rows, cols), ids))


def logps_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    chunk_size: int | None = None,
) -> TokenLogps:
    """Label-token logps from (B, T, V) logits (``logits[b, t - 1]`` predicts
    ``labels[b, t]``), with float32 temporaries for ``chunk_size`` tokens at a time
    (default: 256 MiB per chunk)."""
    if logits.ndim != 3 or logits.shape[:2] != labels.shape:
        raise ValueError(
            f"logits must have shape (B, T, V) matching labels {tuple(labels.shape)}, "
            f"got {tuple(logits.shape)}"
        )
    labels = labels.to(logits.device)
    if _every_token_a_label(logits, labels, ignore_index):
        _check_targets(labels[:, 1:], logits.shape[-1])
        return TokenLogps(*dense_logits_logps(logits, labels, chunk_size, ignore_index))
    rows, cols, targets = _label_positions(labels, ignore_index)
    _check_targets(targets, logits.shape[-1])
    logps, ids = chunked_logits_logps(logits, rows, cols - 1, targets, chunk_size)
    return _scatter(rows, cols, logps, ids, labels.shape)


def _every_token_a_label(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> bool:
    """Whether every position but the first holds a label (packed, uniform or single rows):
    then ``dense_logits_logps`` reads the logits in place instead of gathering label rows."""
    return (
        labels.shape[1] > 1
        and logits.is_contiguous()
        and bool((labels[:, 1:] != ignore_index).all())
    )


def chunked_logps(
    hidden_states: torch.Tensor,
    lm_head_weight: torch.Tensor,
    labels: torch.Tensor,
    lm_head_bias: torch.Tensor | None = None,
    chunk_size: int | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> TokenLogps:
    """Label-token logps from (B, T, H) hidden states through the head ``lm_head_weight``
    (V, H), at most ``chunk_size`` tokens of logits at a time (default: 256 MiB of float32
    logits per chunk), in forward and backward. Where a fused linear cross-entropy runs on
    the device (liger-kernel on CUDA, ``twinkle.kernel``) and no ``chunk_size`` is asked
    for, that kernel computes them instead, in the head matmul's dtype."""
    if hidden_states.ndim != 3 or hidden_states.shape[:2] != labels.shape:
        raise ValueError(
            f"hidden_states must have shape (B, T, H) matching labels {tuple(labels.shape)}, "
            f"got {tuple(hidden_states.shape)}"
        )
    rows, cols, targets = _label_positions(labels.to(hidden_states.device), ignore_index)
    _check_targets(targets, lm_head_weight.shape[0])
    hidden = hidden_states[rows, cols - 1]
    fused = None if chunk_size else fast_path("fused_linear_cross_entropy", hidden.device)
    if fused is None:
        logps, ids = chunked_linear_logps(hidden, lm_head_weight, targets, lm_head_bias, chunk_size)
    else:
        dtype = matmul_dtype(hidden, lm_head_weight)
        bias = None if lm_head_bias is None else lm_head_bias.to(dtype)
        logps, ids = fused(hidden.to(dtype), lm_head_weight.to(dtype), targets, bias)
    return _scatter(rows, cols, logps, ids, labels.shape)


def token_logps(
    outputs: Mapping[str, Any],
    labels: torch.Tensor,
    *,
    owner: str,
    ignore_index: int = IGNORE_INDEX,
    chunk_size: int | None = None,
) -> TokenLogps:
    """The label-token logps from ``outputs`` in any of the three forms (module docstring)."""
    if outputs.get("logps") is not None:
        logps = torch.as_tensor(outputs["logps"])
        if logps.shape != labels.shape:
            raise ValueError(
                f"{owner}: outputs['logps'] has shape {tuple(logps.shape)} but labels have "
                f"{tuple(labels.shape)}; logps must be aligned with labels"
            )
        return TokenLogps(logps.to(compute_dtype(logps)), None)
    if outputs.get("logits") is not None:
        return logps_from_logits(outputs["logits"], labels, ignore_index, chunk_size)
    if outputs.get("hidden_states") is not None and outputs.get("lm_head_weight") is not None:
        return chunked_logps(
            outputs["hidden_states"],
            outputs["lm_head_weight"],
            labels,
            outputs.get("lm_head_bias"),
            chunk_size,
            ignore_index,
        )
    raise ValueError(
        f"{owner} needs outputs['logps'] (B, T), outputs['logits'] (B, T, V), or "
        f"outputs['hidden_states'] (B, T, H) with outputs['lm_head_weight'] (V, H); "
        f"got keys {sorted(k for k, v in outputs.items() if v is not None)}"
    )
