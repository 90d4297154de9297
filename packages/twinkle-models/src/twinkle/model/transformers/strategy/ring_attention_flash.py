"""Ring attention's blocks through flash-attention's varlen kernels, where a GPU has them.

A block is this rank's queries against one ring rank's keys and values. Plain torch
(``ring_attention.TorchBlocks``) computes it with a (B, Tq, Tk) mask; flash-attention takes
no mask, only a causal flag and packed sequences, so each block is put in that form here
(``FlashBlock``), once per forward and pair of ranks:

- the zigzag split decides what a block needs: a rank's chunks r and 2 × cp - 1 - r hold
  sorted row positions, so its own block is causal; a block of a lower rank is seen whole
  by all of its queries through its first chunk only; a block of a higher rank is seen
  whole by the second half of its queries only (no causal mask in either);
- the segments (packed sequences, or padding) split the selected tokens into varlen
  sequences: per row and segment present on both sides, that side's tokens in position
  order, so flash-attention's per-sequence causal mask is the row's.

``FlashBlocks`` gathers the tokens, runs ``varlen_attention_lse`` and its backward (the
``twinkle.kernel`` ops; flash-attn on CUDA) and scatters the results back into the ring's
grouped layout, where they merge as the torch blocks' do. The kernels take half precision
(``FLASH_DTYPES``); other dtypes, and devices without the fast path, run the torch blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from twinkle.kernel import fast_path
from twinkle.kernel.varlen_attention_lse import BACKWARD_OP, OP

FLASH_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class FlashBlock:
    """One block in flash-attention's varlen form: which of the query rank's (B × T) tokens
    (``q_index``, flattened row-major) and of the key rank's (``k_index``) it runs, grouped
    into sequences (``cu_seqlens_q``/``_k``, int32), and whether the mask is causal."""

    q_index: torch.Tensor
    k_index: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    causal: bool

    def mask(self, batch: int, length: int) -> torch.Tensor:
        """The (B, T, T) mask this block computes (for checking it against the layout's)."""
        mask = torch.zeros(batch * length, batch * length, dtype=torch.bool)
        bounds = zip(
            self.cu_seqlens_q[:-1].tolist(),
            self.cu_seqlens_q[1:].tolist(),
            self.cu_seqlens_k[:-1].tolist(),
            self.cu_seqlens_k[1:].tolist(),
            strict=True,
        )
        for q0, q1, k0, k1 in bounds:
            seen = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool)
            if self.causal:
                seen = seen.tril(k1 - k0 - (q1 - q0))
            rows, cols = self.q_index[q0:q1].cpu(), self.k_index[k0:k1].cpu()
            mask[rows.unsqueeze(1), cols.unsqueeze(0)] = seen
        per_row = mask.view(batch, length, batch, length)
        return per_row.diagonal(dim1=0, dim2=2).permute(2, 0, 1)


def _varlen(ids: torch.Tensor, flat: torch.Tensor, common: torch.Tensor):
    """The tokens whose (row, segment) id is in ``common``, grouped by it in position order:
    (their flat indices, cu_seqlens, the longest sequence)."""
    keep = torch.isin(ids, common)
    ids, flat = ids[keep], flat[keep]
    order = torch.argsort(ids, stable=True)
    counts = torch.unique(ids, return_counts=True)[1]
    bounds = torch.nn.functional.pad(counts.cumsum(0), (1, 0)).to(torch.int32)
    return flat[order], bounds, int(counts.max())


def plan_block(layout, query_rank: int, key_rank: int) -> FlashBlock | None:
    """``key_rank``'s block for ``query_rank``'s queries in varlen form; None when no query
    sees any of its keys. ``layout`` is the forward's ``RingLayout``."""
    segments, device = layout.segments, layout.segments.device
    batch, local = segments.shape[0], layout.length // layout.size
    every, half = torch.arange(local, device=device), local // 2
    if key_rank == query_rank:
        q_sel, k_sel, causal = every, every, True
    elif key_rank < query_rank:  # its first chunk precedes both of ours; its second, neither
        q_sel, k_sel, causal = every, every[:half], False
    else:  # both its chunks precede our second chunk only
        q_sel, k_sel, causal = every[half:], every, False
    lowest = int(segments.min())
    span = int(segments.max()) - lowest + 1
    rows = torch.arange(batch, device=device).unsqueeze(1)

    def side(rank: int, selected: torch.Tensor):
        seg = segments[:, layout.positions(rank)[selected]]
        return (rows * span + seg - lowest).reshape(-1), (rows * local + selected).reshape(-1)

    ids_q, flat_q = side(query_rank, q_sel)
    ids_k, flat_k = side(key_rank, k_sel)
    common = torch.unique(ids_q)
    common = common[torch.isin(common, ids_k)]
    if common.numel() == 0:
        return None
    q_index, cu_q, max_q = _varlen(ids_q, flat_q, common)
    k_index, cu_k, max_k = _varlen(ids_k, flat_k, common)
    return FlashBlock(q_index, k_index, cu_q, cu_k, max_q, max_k, causal)


# Between the ring's grouped layout, q (B, Hkv, G, T, D), k/v (B, Hkv, T, D), lse
# (B, Hkv, G, T), and flash-attention's, tokens first: (B * T, H, D) and lse (H, B * T).


def _tokens(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 5:
        batch, kv, groups, length, dim = x.shape
        return x.permute(0, 3, 1, 2, 4).reshape(batch * length, kv * groups, dim)
    batch, kv, length, dim = x.shape
    return x.permute(0, 2, 1, 3).reshape(batch * length, kv, dim)


def _grouped(tokens: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    if like.dim() == 5:
        batch, kv, groups, length, dim = like.shape
        return tokens.view(batch, length, kv, groups, dim).permute(0, 2, 3, 1, 4)
    batch, kv, length, dim = like.shape
    return tokens.view(batch, length, kv, dim).permute(0, 2, 1, 3)


def _lse_tokens(lse: torch.Tensor) -> torch.Tensor:
    batch, kv, groups, length = lse.shape
    return lse.permute(1, 2, 0, 3).reshape(kv * groups, batch * length)


def _lse_grouped(lse: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    batch, kv, groups, length = shape
    return lse.view(kv, groups, batch, length).permute(2, 0, 1, 3)


def _scatter(values: torch.Tensor, index: torch.Tensor, rows: int, dtype, fill=0.0):
    """(rows, ...) of ``fill`` with ``values`` at ``index`` (along the first dimension)."""
    full = values.new_full((rows, *values.shape[1:]), fill, dtype=dtype)
    return full.index_copy(0, index, values.to(dtype))


class FlashBlocks:
    """Ring attention's blocks through the ``varlen_attention_lse`` kernels (see the module
    docstring); same calls and results as ``ring_attention.TorchBlocks``."""

    def __init__(self, forward_kernel, backward_kernel) -> None:
        self.forward_kernel, self.backward_kernel = forward_kernel, backward_kernel

    @staticmethod
    def _plan(layout, key_rank: int) -> FlashBlock | None:
        key = (layout.rank, key_rank)
        if key not in layout.flash_blocks:
            layout.flash_blocks[key] = plan_block(layout, *key)
        return layout.flash_blocks[key]

    def _inputs(self, plan: FlashBlock, q, k, v):
        q_t = _tokens(q).index_select(0, plan.q_index)
        k_t, v_t = (_tokens(t).index_select(0, plan.k_index) for t in (k, v))
        return q_t, k_t, v_t

    def _varlen(self, plan: FlashBlock, scale: float):
        return (
            plan.cu_seqlens_q,
            plan.cu_seqlens_k,
            plan.max_seqlen_q,
            plan.max_seqlen_k,
            scale,
            plan.causal,
        )

    def forward(self, layout, key_rank: int, q, k, v, scale: float, accumulate: torch.dtype):
        """(out, lse) of ``q`` against ``key_rank``'s block, in the grouped layout and the
        ``accumulate`` dtype (lse -inf, out 0 for queries that see none of it); or None."""
        plan = self._plan(layout, key_rank)
        if plan is None:
            return None
        out_t, lse_t = self.forward_kernel(*self._inputs(plan, q, k, v), *self._varlen(plan, scale))
        rows = q.shape[0] * q.shape[3]
        out = _scatter(out_t, plan.q_index, rows, accumulate)
        lse = _scatter(lse_t.transpose(0, 1), plan.q_index, rows, accumulate, float("-inf"))
        return _grouped(out, q), _lse_grouped(lse.transpose(0, 1), q.shape[:-1])

    def backward(self, layout, key_rank: int, dout, q, k, v, out, lse, scale: float):
        """(dq, dk, dv) of ``key_rank``'s block given the merged ``out`` and ``lse``, in the
        grouped layout and ``out``'s dtype; or None when no query sees the block."""
        plan = self._plan(layout, key_rank)
        if plan is None:
            return None
        q_t, k_t, v_t = self._inputs(plan, q, k, v)
        dout_t, out_t = (_tokens(t).index_select(0, plan.q_index) for t in (dout, out))
        lse_t = _lse_tokens(lse).index_select(1, plan.q_index)
        grads = self.backward_kernel(
            dout_t, q_t, k_t, v_t, out_t, lse_t, *self._varlen(plan, scale)
        )
        rows_q, rows_k = q.shape[0] * q.shape[3], k.shape[0] * k.shape[2]
        dq_t, dk_t, dv_t = grads
        dq = _scatter(dq_t, plan.q_index, rows_q, out.dtype)
        dk, dv = (_scatter(t, plan.k_index, rows_k, out.dtype) for t in (dk_t, dv_t))
        return _grouped(dq, q), _grouped(dk, k), _grouped(dv, k)


def flash_blocks(query: torch.Tensor) -> FlashBlocks | None:
    """The flash blocks for ``query``'s device and dtype, or None where the torch blocks run
    (no fast path there, as on a CPU, or a dtype the kernels do not take)."""
    if query.dtype not in FLASH_DTYPES or not has_flash_blocks(query.device):
        return None
    return FlashBlocks(fast_path(OP, query.device), fast_path(BACKWARD_OP, query.device))


def has_flash_blocks(device: torch.device) -> bool:
    """Whether ring attention's blocks run flash-attention's varlen kernels on ``device``
    (for half-precision queries): they skip the pairs across packed sequences, where the
    torch blocks compute every pair and mask them."""
    return fast_path(OP, device) is not None and fast_path(BACKWARD_OP, device) is not None
