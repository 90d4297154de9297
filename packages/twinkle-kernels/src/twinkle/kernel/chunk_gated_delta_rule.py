"""The gated delta rule (GatedDeltaNet's linear attention, in Qwen3.5 and Qwen3-Next) over
packed sequences: a chunked torch reference and a dispatcher.

Per sequence, with a state ``S`` of shape ``[K, V]`` per value head, starting at zero (or
``initial_state``), each token ``t`` does::

    S = exp(g_t) * S                          # forget (g_t <= 0, in log space)
    S = S + beta_t * k_t (v_t - S^T k_t)^T    # delta rule: write what S mispredicts
    o_t = S^T (scale * q_t)

With ``cu_seqlens`` the state restarts at every sequence boundary of the packed row, so
the result equals running each sequence alone. This is the math of transformers' torch
fallback (``torch_recurrent_gated_delta_rule``) and of flash-linear-attention's
``chunk_gated_delta_rule``, with the same argument names and layout ``[B, T, H, D]``.

The reference works chunk by chunk (``chunk_size`` tokens): inside a chunk the recurrence
unrolls into a unit lower-triangular system solved with a few matmuls; only the state
hand-over between chunks is sequential. Each sequence is cut into its own chunks (the
last one zero-padded: a zero key, value, beta and log-decay leave the state unchanged),
and the chunks are laid out so that step ``j`` of the scan handles the ``j``-th chunk of
every sequence that long at once: the loop runs over the longest sequence's chunks only.
"""

from __future__ import annotations

import torch

from twinkle.kernel import registry
from twinkle.kernel.varlen import check_cu_seqlens

OP = "chunk_gated_delta_rule"


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(|x|^2 + eps)`` over the last dimension, as transformers and fla compute it."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def torch_chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``q``, ``k`` ``[B, T, H, K]``; ``v`` ``[B, T, HV, V]``; ``g``, ``beta`` ``[B, T, HV]``.

    ``HV`` may be a multiple of ``H`` (each query/key head serves ``HV // H`` consecutive
    value heads). ``scale`` defaults to ``K ** -0.5``. With ``cu_seqlens`` (``[N + 1]``),
    ``B`` is 1 and the row holds N sequences; without it each row is one sequence.
    ``initial_state`` and the final state are ``[N, HV, K, V]`` (float32). Returns the
    output ``[B, T, HV, V]`` in ``q``'s dtype, and the final state or None. Computed in
    float32.
    """
    batch, length, heads, key_dim = _check(q, k, v, g, beta)
    out_dtype = q.dtype
    value_heads, value_dim = v.shape[-2:]
    if cu_seqlens is None:
        bounds = torch.arange(batch + 1, device=q.device) * length
    elif batch != 1:
        raise ValueError(
            f"with cu_seqlens the sequences are packed into one row, but q has {batch} rows; "
            "flatten them to [1, total, ...]"
        )
    else:
        bounds = check_cu_seqlens(cu_seqlens, length)
    num_seqs = bounds.numel() - 1
    if initial_state is not None and tuple(initial_state.shape) != (
        num_seqs,
        value_heads,
        key_dim,
        value_dim,
    ):
        raise ValueError(
            f"initial_state must be [sequences={num_seqs}, {value_heads}, {key_dim}, "
            f"{value_dim}], got {tuple(initial_state.shape)}"
        )

    # One flat token axis, float32; query/key heads repeated to the value heads.
    total = batch * length
    q, k, v = (x.reshape(total, x.shape[2], x.shape[3]).float() for x in (q, k, v))
    g, beta = (x.reshape(total, value_heads).float() for x in (g, beta))
    if value_heads != heads:
        q, k = (x.repeat_interleave(value_heads // heads, dim=1) for x in (q, k))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q = q * (key_dim**-0.5 if scale is None else scale)

    layout = _ChunkLayout(bounds, chunk_size)
    q, k, v = (layout.gather(x) for x in (q, k, v))  # [chunks, HV, C, D]
    g, beta = (layout.gather(x.unsqueeze(-1)).squeeze(-1) for x in (g, beta))  # [chunks, HV, C]

    # Inside a chunk: decay[i, j] = exp(sum of g over (j, i]) for j <= i, else 0.
    log_decay = g.cumsum(dim=-1)
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    pair = (log_decay.unsqueeze(-1) - log_decay.unsqueeze(-2)).masked_fill(upper, float("-inf"))
    decay = pair.exp()
    k_beta = k * beta.unsqueeze(-1)
    # Token t's delta (beta_t times what the state mispredicts) depends on the deltas of the
    # earlier tokens of the chunk: (I + strictly_lower(k_beta k^T * decay)) delta = rhs.
    system = (k_beta @ k.transpose(-1, -2)) * decay
    deltas_from_values = torch.linalg.solve_triangular(
        system, v * beta.unsqueeze(-1), upper=False, unitriangular=True
    )
    deltas_per_state = torch.linalg.solve_triangular(
        system, k_beta * log_decay.exp().unsqueeze(-1), upper=False, unitriangular=True
    )
    attention = (q @ k.transpose(-1, -2)) * decay
    q_decayed = q * log_decay.exp().unsqueeze(-1)
    k_to_end = k * (log_decay[..., -1:] - log_decay).exp().unsqueeze(-1)
    chunk_decay = log_decay[..., -1].exp()[..., None, None]

    state = (
        torch.zeros(num_seqs, value_heads, key_dim, value_dim, device=q.device)
        if initial_state is None
        else initial_state.float()[layout.order]
    )
    outputs, finished = [], []
    for block in layout.steps:
        active = block.stop - block.start
        if active < state.shape[0]:
            finished.append(state[active:])
            state = state[:active]
        delta = deltas_from_values[block] - deltas_per_state[block] @ state
        outputs.append(q_decayed[block] @ state + attention[block] @ delta)
        state = state * chunk_decay[block] + k_to_end[block].transpose(-1, -2) @ delta
    out = layout.scatter(torch.cat(outputs)).reshape(batch, length, value_heads, value_dim)
    final = None
    if output_final_state:
        # Sequences finish shortest first: reversed, the pieces are in layout order.
        final = torch.cat([state, *reversed(finished)])[layout.inverse_order]
    return out.to(out_dtype), final


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`torch_chunk_gated_delta_rule`, or a fast path for ``q``'s device (``registry``)."""
    implementation = registry.select(OP, q.device, backend)
    return implementation(
        q,
        k,
        v,
        g,
        beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        cu_seqlens=cu_seqlens,
    )


class _ChunkLayout:
    """Where each token goes when every sequence is cut into chunks of ``size`` tokens.

    Chunks are ordered by their index inside their sequence, then by sequence, longest
    sequence first; ``steps[j]`` is the slice of the ``j``-th chunks, and the sequences
    in it are the first ``len(steps[j])`` of ``order``.
    """

    def __init__(self, bounds: torch.Tensor, size: int) -> None:
        starts, lengths = bounds[:-1].tolist(), bounds.diff().tolist()
        counts = [-(-n // size) for n in lengths]
        order = sorted(range(len(counts)), key=lambda s: -counts[s])
        chunk_seq, chunk_pos, self.steps = [], [], []
        for j in range(counts[order[0]]):
            members = [s for s in order if counts[s] > j]  # a prefix of `order`
            self.steps.append(slice(len(chunk_seq), len(chunk_seq) + len(members)))
            chunk_seq += members
            chunk_pos += [j] * len(members)
        device = bounds.device
        self.total = int(bounds[-1])
        self.size = size
        seq = torch.tensor(chunk_seq, device=device)
        offsets = torch.tensor(chunk_pos, device=device) * size
        first = torch.tensor(starts, device=device)[seq] + offsets
        index = first.unsqueeze(1) + torch.arange(size, device=device)
        valid = index < (bounds[1:][seq]).unsqueeze(1)
        # Padding slots read an extra zero row appended after the last token.
        self.index = torch.where(valid, index, self.total).flatten()
        flat_valid = valid.flatten()
        self.slot = torch.empty(self.total, dtype=torch.long, device=device)
        self.slot[self.index[flat_valid]] = torch.arange(flat_valid.numel(), device=device)[
            flat_valid
        ]
        self.order = torch.tensor(order, device=device)
        self.inverse_order = torch.argsort(self.order)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[tokens, H, D]`` to ``[chunks, H, size, D]``, zero where a chunk runs past its end."""
        padded = torch.cat([x, x.new_zeros(1, *x.shape[1:])])
        chunks = padded[self.index].view(-1, self.size, *x.shape[1:])
        return chunks.transpose(1, 2)

    def scatter(self, chunks: torch.Tensor) -> torch.Tensor:
        """``[chunks, H, size, D]`` back to ``[tokens, H, D]``, padding dropped."""
        flat = chunks.transpose(1, 2).reshape(-1, *chunks.shape[1:2], chunks.shape[-1])
        return flat[self.slot]


def _check(q, k, v, g, beta) -> tuple[int, int, int, int]:
    if q.dim() != 4 or q.shape != k.shape:
        raise ValueError(
            f"q and k must both be [batch, tokens, heads, key_dim], got {tuple(q.shape)} and "
            f"{tuple(k.shape)}"
        )
    batch, length, heads, key_dim = q.shape
    if v.dim() != 4 or v.shape[:2] != q.shape[:2] or v.shape[2] % heads:
        raise ValueError(
            f"v must be [batch={batch}, tokens={length}, value_heads, value_dim] with value_heads "
            f"a multiple of the {heads} query/key heads, got {tuple(v.shape)}"
        )
    for name, x in (("g", g), ("beta", beta)):
        if tuple(x.shape) != tuple(v.shape[:3]):
            raise ValueError(
                f"{name} must be [batch, tokens, value_heads] = {tuple(v.shape[:3])}, got "
                f"{tuple(x.shape)}"
            )
    return batch, length, heads, key_dim


registry.register_reference(OP, torch_chunk_gated_delta_rule)
