"""Log-probabilities of target tokens, computed a chunk of tokens at a time.

For N tokens and a vocabulary of V, a plain log-softmax holds (N, V) float32 temporaries
(the log-softmax and its gradient) on top of the logits: at N = 4096 and V = 150k that
is 2.4 GB each. Both functions here keep each token's log-sum-exp (N floats) in forward
and rebuild one chunk's softmax at a time in backward, so their temporaries never exceed
one chunk:

* ``chunked_linear_logps`` starts from hidden states and the lm_head, so the full logits
  never exist at all. Backward recomputes each chunk's logits: four head matmuls instead
  of three.
* ``chunked_logits_logps`` starts from logits the model already computed; beyond them
  it holds only their gradient and one chunk.

Precision: log-sum-exp and softmax are float32 (float64 for float64 inputs), whatever
the logits' dtype. The head matmuls run in the autocast dtype when autocast is on (as
``nn.Linear`` would), else in the promoted dtype of hidden states and weight; the weight
gradient is summed over chunks in the weight's dtype.
"""

from __future__ import annotations

import torch

CHUNK_BYTES = 256 * 2**20


def default_chunk_size(vocab_size: int) -> int:
    """Tokens per chunk such that one chunk's float32 logits take at most 256 MiB."""
    return max(1, CHUNK_BYTES // (4 * vocab_size))


def matmul_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the head matmul runs in: the autocast dtype when autocast is on, as
    ``nn.Linear`` would use, else the promoted dtype of the two."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type) and hidden.dtype != torch.float64:
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunks(n: int, chunk_size: int) -> list[slice]:
    return [slice(start, start + chunk_size) for start in range(0, n, chunk_size)]


ARGMAX_BLOCK = 64


def max_and_argmax(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits.max(dim=-1)`` of (n, V) logits: the maxima and the first index of each
    (NaN counting as the maximum, as there). On a CPU, torch's argmax over a long row is
    not vectorised (a tenth of the speed of ``amax``), so the maxima of blocks of 64
    columns are found first and the argmax is taken within each row's first winning
    block: 0.9 ms instead of 2.7 ms on (768, 3909) float32, equal ids."""
    n, vocab = logits.shape
    if logits.device.type != "cpu" or vocab < 2 * ARGMAX_BLOCK:
        return logits.max(dim=-1)
    blocks = vocab // ARGMAX_BLOCK
    body = logits[:, : blocks * ARGMAX_BLOCK].unflatten(-1, (blocks, ARGMAX_BLOCK))
    block_top = body.amax(dim=-1)
    if vocab > blocks * ARGMAX_BLOCK:  # the last, shorter block
        tail = logits[:, blocks * ARGMAX_BLOCK :].amax(dim=-1, keepdim=True)
        block_top = torch.cat([block_top, tail], dim=1)
    top, block = block_top.max(dim=-1)
    start = block * ARGMAX_BLOCK
    # The last block's columns past the vocabulary repeat its last one: never a first index.
    columns = torch.arange(ARGMAX_BLOCK, device=logits.device)
    columns = (start[:, None] + columns).clamp_(max=vocab - 1)
    return top, start + logits.gather(1, columns).argmax(dim=-1)


def _softmax_kernels(device: torch.device) -> bool:
    """Whether a chunk's exponentials go through torch's (log-)softmax kernels, written over
    it: on a CPU their vectorised exp takes a third less time than ``torch.exp`` (0.19
    against 0.30 ms on (80, 3909) float32). Elsewhere ``exp(logits - lse)``, as before:
    a kernel writing over its own input has not been run on a GPU here."""
    return device.type == "cpu"


def _forward_chunk(logits, targets, lse, logps, ids) -> None:
    """Fill this chunk's log-sum-exp, target logps and argmax ids from its float logits,
    which it overwrites (every caller passes a chunk of its own). The maximum and the
    argmax come first; the rest runs in place, with no (n, V) temporary: torch's
    log-softmax written over the logits where ``_softmax_kernels`` says so (its value at
    the argmax is exactly ``top - lse``)."""
    top, argmax = max_and_argmax(logits)
    if _softmax_kernels(logits.device):
        torch.log_softmax(logits, dim=-1, out=logits)
        logps.copy_(logits.gather(1, targets[:, None]).squeeze(1))
        lse.copy_(top - logits.gather(1, argmax[:, None]).squeeze(1))
    else:
        target = logits.gather(1, targets[:, None]).squeeze(1)
        lse.copy_(logits.sub_(top[:, None]).exp_().sum(dim=-1).log_().add_(top))
        logps.copy_(target - lse)
    ids.copy_(argmax)


def _logps_grad_(logits, lse, targets, grad) -> torch.Tensor:
    """Turn a chunk's float logits, in place, into the gradient of ``sum(grad * logps)``
    with respect to them: ``grad * (onehot(target) - softmax)``, the softmax written over
    the logits by torch's kernel where ``_softmax_kernels`` says so."""
    if _softmax_kernels(logits.device):
        torch.softmax(logits, dim=-1, out=logits)
    else:
        logits.sub_(lse[:, None]).exp_()
    logits.mul_(-grad[:, None])
    rows = torch.arange(grad.shape[0], device=grad.device)
    logits[rows, targets] += grad
    return logits


def _new_outputs(n: int, dtype: torch.dtype, device: torch.device):
    empty = torch.empty(n, dtype=dtype, device=device)
    return empty, torch.empty_like(empty), torch.empty(n, dtype=torch.long, device=device)


def _linear(hidden, weight, bias, dtype) -> torch.Tensor:
    out = hidden.to(weight.dtype) @ weight.T
    if bias is not None:
        out += bias
    return out.to(dtype)


class _ChunkedLinearLogps(torch.autograd.Function):
    """(N, H) hidden, (V, H) weight, (V,) bias or None, (N,) targets -> (N,) logps and the
    (N,) argmax ids; the ids carry no gradient."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk_size, mm_dtype):
        float_dtype = _float_dtype(mm_dtype)
        lse, logps, ids = _new_outputs(hidden.shape[0], float_dtype, hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(mm_dtype)
            b = None if bias is None else bias.to(mm_dtype)
            for part in _chunks(hidden.shape[0], chunk_size):
                logits = _linear(hidden[part], w, b, float_dtype)
                _forward_chunk(logits, targets[part], lse[part], logps[part], ids[part])
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.chunk_size = chunk_size
        ctx.mm_dtype = mm_dtype
        ctx.mark_non_differentiable(ids)
        return logps, ids

    @staticmethod
    def backward(ctx, grad_logps, _grad_ids):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros_like(weight) if need_weight else None
        grad_bias = torch.zeros_like(bias) if need_bias else None
        with torch.autocast(hidden.device.type, enabled=False):
            w = weight.to(ctx.mm_dtype)
            b = None if bias is None else bias.to(ctx.mm_dtype)
            for part in _chunks(hidden.shape[0], ctx.chunk_size):
                logits = _linear(hidden[part], w, b, lse.dtype)
                grad = grad_logps[part].to(lse.dtype)
                grad_logits = _logps_grad_(logits, lse[part], targets[part], grad)
                if need_bias:
                    grad_bias += grad_logits.sum(0)
                grad_logits = grad_logits.to(ctx.mm_dtype)
                if need_hidden:
                    grad_hidden[part] = grad_logits @ w
                if need_weight:
                    chunk_hidden = hidden[part].to(ctx.mm_dtype)
                    if grad_weight.dtype == ctx.mm_dtype:
                        grad_weight.addmm_(grad_logits.T, chunk_hidden)
                    else:
                        grad_weight += grad_logits.T @ chunk_hidden
        return grad_hidden, grad_weight, grad_bias, None, None, None


class _ChunkedLogitsLogps(torch.autograd.Function):
    """(B, T, V) logits, (N,) rows and positions, (N,) targets -> (N,) logps of
    ``logits[rows, positions]`` and the (N,) argmax ids; the ids carry no gradient."""

    @staticmethod
    def forward(ctx, logits, rows, positions, targets, chunk_size):
        float_dtype = _float_dtype(logits.dtype)
        lse, logps, ids = _new_outputs(rows.shape[0], float_dtype, logits.device)
        for part in _chunks(rows.shape[0], chunk_size):
            chunk = logits[rows[part], positions[part]].to(float_dtype)
            _forward_chunk(chunk, targets[part], lse[part], logps[part], ids[part])
        ctx.save_for_backward(logits, rows, positions, targets, lse)
        ctx.chunk_size = chunk_size
        ctx.mark_non_differentiable(ids)
        return logps, ids

    @staticmethod
    def backward(ctx, grad_logps, _grad_ids):
        logits, rows, positions, targets, lse = ctx.saved_tensors
        grad_logits = torch.zeros_like(logits)
        for part in _chunks(rows.shape[0], ctx.chunk_size):
            chunk = logits[rows[part], positions[part]].to(lse.dtype)
            grad = grad_logps[part].to(lse.dtype)
            grad_chunk = _logps_grad_(chunk, lse[part], targets[part], grad)
            grad_logits[rows[part], positions[part]] = grad_chunk.to(logits.dtype)
        return grad_logits, None, None, None, None


class _DenseLogitsLogps(torch.autograd.Function):
    """Contiguous (B, T, V) logits and (B, T) labels, every ``labels[:, 1:]`` a label ->
    (B, T) logps and argmax ids aligned with the labels (0 and -100 at t = 0).

    The rows of a packed, uniform or single-sequence batch: the logits are read a chunk of
    positions at a time as views, not copies. Forward is torch's own cross-entropy per
    position (one fused log-softmax and pick, as a hand-written loss runs) and the argmax;
    backward is torch's softmax of each chunk turned in place into the gradient (on every
    device: see ``_softmax_kernels``). No log-sum-exp is kept, no zero fill, gather or
    scatter of rows. Each row's last position predicts nothing; its gradient is set to
    zero."""

    @staticmethod
    def forward(ctx, logits, labels, chunk_size, ignore_index):
        batch, width, vocab = logits.shape
        float_dtype = _float_dtype(logits.dtype)
        flat = logits.view(-1, vocab)
        targets = torch.nn.functional.pad(labels[:, 1:], (0, 1)).reshape(-1)
        logps, ids = [], []
        for part in _chunks(flat.shape[0], chunk_size):
            chunk = flat[part].to(float_dtype)
            loss = torch.nn.functional.cross_entropy(chunk, targets[part], reduction="none")
            logps.append(loss.neg_())
            ids.append(max_and_argmax(chunk)[1])
        logps = logps[0] if len(logps) == 1 else torch.cat(logps)
        ids = ids[0] if len(ids) == 1 else torch.cat(ids)
        ctx.save_for_backward(logits, targets)
        ctx.chunk_size = chunk_size
        ctx.float_dtype = float_dtype
        aligned_ids = torch.nn.functional.pad(
            ids.view(batch, width)[:, :-1], (1, 0), value=ignore_index
        )
        ctx.mark_non_differentiable(aligned_ids)
        return torch.nn.functional.pad(logps.view(batch, width)[:, :-1], (1, 0)), aligned_ids

    @staticmethod
    def backward(ctx, grad_logps, _grad_ids):
        logits, targets = ctx.saved_tensors
        flat = logits.view(-1, logits.shape[-1])
        grad_all = torch.nn.functional.pad(grad_logps[:, 1:].to(ctx.float_dtype), (0, 1))
        grad_all = grad_all.reshape(-1)
        parts = _chunks(flat.shape[0], ctx.chunk_size)
        grad_flat = None if len(parts) == 1 else torch.empty_like(flat)
        in_place = grad_flat is not None and flat.dtype == ctx.float_dtype
        for part in parts:
            grad = grad_all[part, None]
            out = grad_flat[part] if in_place else None  # else computed in float, then cast
            chunk = torch.softmax(flat[part], dim=-1, dtype=ctx.float_dtype, out=out)
            chunk.mul_(-grad).scatter_add_(1, targets[part, None], grad)
            if grad_flat is None:
                grad_flat = chunk.to(logits.dtype)
            elif not in_place:
                grad_flat[part] = chunk
        grad_logits = grad_flat.view_as(logits)
        grad_logits[:, -1] = 0
        return grad_logits, None, None, None


def _check_chunk_size(chunk_size: int | None, vocab_size: int) -> int:
    if chunk_size is None:
        return default_chunk_size(vocab_size)
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive number of tokens, got {chunk_size!r}")
    return chunk_size


def chunked_linear_logps(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(hidden @ weight.T + bias)[i, targets[i]]`` for (N, H) ``hidden``, and
    the argmax token of each row, never holding more than ``chunk_size`` rows of logits
    (default: ``default_chunk_size(V)``). Differentiable in hidden, weight and bias."""
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden states (N, H) and lm_head_weight (V, H) must share H, got "
            f"{tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    vocab_size = weight.shape[0]
    if bias is not None and tuple(bias.shape) != (vocab_size,):
        raise ValueError(f"lm_head_bias must have shape ({vocab_size},), got {tuple(bias.shape)}")
    chunk_size = _check_chunk_size(chunk_size, vocab_size)
    return _ChunkedLinearLogps.apply(
        hidden, weight, bias, targets, chunk_size, matmul_dtype(hidden, weight)
    )


def chunked_logits_logps(
    logits: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    targets: torch.Tensor,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log_softmax(logits[rows[i], positions[i]])[targets[i]]`` for (B, T, V) ``logits``,
    and the argmax token of each of those rows, with float32 temporaries for at most
    ``chunk_size`` tokens at a time. Differentiable in logits."""
    return _ChunkedLogitsLogps.apply(
        logits, rows, positions, targets, _check_chunk_size(chunk_size, logits.shape[-1])
    )


def dense_logits_logps(
    logits: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int | None = None,
    ignore_index: int = -100,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``chunked_logits_logps`` for contiguous (B, T, V) ``logits`` whose every
    ``labels[:, 1:]`` is a label: (B, T) logps and argmax ids aligned with ``labels``
    (``logits[b, t - 1]`` predicts ``labels[b, t]``; 0 and ``ignore_index`` at t = 0),
    the logits read in place. Differentiable in logits."""
    return _DenseLogitsLogps.apply(
        logits, labels, _check_chunk_size(chunk_size, logits.shape[-1]), ignore_index
    )
