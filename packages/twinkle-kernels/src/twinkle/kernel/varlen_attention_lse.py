"""Attention over packed sequences with its log-sum-exp, and the backward from a final one:
the two halves of one attention block that ring attention merges with others.

``q`` ``[Nq, H, D]`` and ``k``/``v`` ``[Nk, Hkv, D]`` (``H`` a multiple of ``Hkv``) hold N
sequences back to back, their boundaries ``cu_seqlens_q`` and ``cu_seqlens_k`` (``[N + 1]``;
the i-th query sequence attends to the i-th key sequence, and their lengths may differ).
``causal`` masks as flash-attention does, aligned to the bottom right: query ``i`` of a
sequence with ``Lq`` queries and ``Lk`` keys sees key ``j`` when ``j <= i + Lk - Lq``
(with ``Lq == Lk``, the usual causal mask); otherwise every query sees its sequence's keys.

``varlen_attention_lse`` returns ``(out [Nq, H, D], lse [H, Nq])``, out in q's dtype, lse in
float32 (flash-attention's varlen layout). ``varlen_attention_lse_backward`` takes the
gradient of an output and the output and lse it is the gradient of, which may be those of
attention over more keys than this block's (ring attention passes the merged ones): the
block's probabilities are ``exp(scores - lse)`` and the softmax's row term is
``(dout * out).sum(-1)``; it returns ``(dq, dk, dv)`` in the inputs' dtypes.
"""

from __future__ import annotations

import torch

from twinkle.kernel import registry
from twinkle.kernel.varlen import check_cu_seqlens

OP = "varlen_attention_lse"
BACKWARD_OP = "varlen_attention_lse_backward"


def _sequences(cu_seqlens_q, cu_seqlens_k, q, k):
    bounds_q = check_cu_seqlens(cu_seqlens_q, q.shape[0]).tolist()
    bounds_k = check_cu_seqlens(cu_seqlens_k, k.shape[0]).tolist()
    if len(bounds_q) != len(bounds_k):
        raise ValueError(
            f"cu_seqlens_q has {len(bounds_q) - 1} sequences and cu_seqlens_k "
            f"{len(bounds_k) - 1}; each query sequence needs its key sequence"
        )
    return list(zip(bounds_q[:-1], bounds_q[1:], bounds_k[:-1], bounds_k[1:], strict=True))


def _probabilities(q, k, lse, scale, causal):
    """(H, Lq, Lk) float32-or-wider probabilities exp(scores - lse) of one sequence."""
    acc = torch.promote_types(q.dtype, torch.float32)
    groups = q.shape[1] // k.shape[1]
    key = k.to(acc).repeat_interleave(groups, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.to(acc), key) * scale
    if causal:
        length_q, length_k = q.shape[0], k.shape[0]
        rows = torch.arange(length_q, device=q.device).unsqueeze(1)
        cols = torch.arange(length_k, device=q.device).unsqueeze(0)
        scores = scores.masked_fill(cols > rows + (length_k - length_q), float("-inf"))
    if lse is None:
        lse = torch.logsumexp(scores, dim=-1)
    finite = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    return torch.exp(scores - finite.unsqueeze(-1)), lse


def torch_varlen_attention_lse(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    scale=None,
    causal=False,
):
    """The reference: each sequence in float32 (or float64 for float64 inputs)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    groups = q.shape[1] // k.shape[1]
    out = torch.zeros_like(q)
    lse = q.new_full(
        (q.shape[1], q.shape[0]), float("-inf"), dtype=torch.promote_types(q.dtype, torch.float32)
    )
    for q0, q1, k0, k1 in _sequences(cu_seqlens_q, cu_seqlens_k, q, k):
        probs, seq_lse = _probabilities(q[q0:q1], k[k0:k1], None, scale, causal)
        value = v[k0:k1].to(probs.dtype).repeat_interleave(groups, dim=1)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", probs, value).to(q.dtype)
        lse[:, q0:q1] = seq_lse
    return out, lse


def torch_varlen_attention_lse_backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    scale=None,
    causal=False,
):
    """The reference backward: each sequence's (dq, dk, dv) from the given out and lse."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    groups = q.shape[1] // k.shape[1]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for q0, q1, k0, k1 in _sequences(cu_seqlens_q, cu_seqlens_k, q, k):
        probs, _ = _probabilities(q[q0:q1], k[k0:k1], lse[:, q0:q1], scale, causal)
        acc = probs.dtype
        grad, output = dout[q0:q1].to(acc), out[q0:q1].to(acc)
        delta = (grad * output).sum(-1).transpose(0, 1)  # (H, Lq)
        value = v[k0:k1].to(acc).repeat_interleave(groups, dim=1)
        key = k[k0:k1].to(acc).repeat_interleave(groups, dim=1)
        dprobs = torch.einsum("qhd,khd->hqk", grad, value)
        dscores = probs * (dprobs - delta.unsqueeze(-1)) * scale
        dq[q0:q1] = torch.einsum("hqk,khd->qhd", dscores, key).to(q.dtype)
        dk_full = torch.einsum("hqk,qhd->khd", dscores, q[q0:q1].to(acc))
        dv_full = torch.einsum("hqk,qhd->khd", probs, grad)
        # Grouped queries: a key/value head's gradient sums its query heads'.
        heads = (k1 - k0, k.shape[1], groups, k.shape[2])
        dk[k0:k1] = dk_full.reshape(heads).sum(2).to(k.dtype)
        dv[k0:k1] = dv_full.reshape(heads).sum(2).to(v.dtype)
    return dq, dk, dv


registry.register_reference(OP, torch_varlen_attention_lse)
registry.register_reference(BACKWARD_OP, torch_varlen_attention_lse_backward)
