"""Ring attention's flash-attention path on one CUDA GPU, every rank of a ring in one process.

One GPU cannot hold a real ring (NCCL refuses two ranks on one device), so each rank of a
ring of ``cp`` is run in turn, as test_ring_attention does on a CPU: its queries against
every rank's key/value block, merged by log-sum-exp, then the backward of each block from
the merged output. ``FlashBlocks`` (flash-attn's varlen kernels, bf16) runs against
``TorchBlocks`` (plain torch, float32 copies of the same bf16 values), for cp 2 and 4 and
for a padded batch and a packed one, at Qwen3-8B's heads (32 query, 8 key/value of 128):
the outputs and the gradients of q, k and v must agree to ``--tol`` relative to the torch
blocks' largest magnitude. Then the time of one rank's blocks (one layer, forward and
backward) each way. A mismatch or an exception fails the script naming the case.

    python benchmarks/gpu/check_ring_attention_gpu.py [--tol 2e-2] [--tokens 8192]

Needs flash-attn (without it: reported as skipped, exit 0). ``--device cpu --small`` runs
the same cases at toy shapes on a CPU with the kernels' torch references in flash-attn's
place (the CPU test test_gpu_validation_scripts.py does so), so the script cannot rot
unnoticed. Under a minute on an H200.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback

import torch

from twinkle.kernel import registry
from twinkle.kernel.varlen_attention_lse import BACKWARD_OP, OP
from twinkle.model.transformers.strategy.ring_attention import (
    RingLayout,
    TorchBlocks,
    merge,
    segments_of,
)
from twinkle.model.transformers.strategy.ring_attention_flash import FlashBlocks

FULL = {"batch": 2, "heads": 32, "kv_heads": 8, "head_dim": 128}
SMALL = {"batch": 2, "heads": 4, "kv_heads": 2, "head_dim": 8}


def segments(kind: str, batch: int, length: int) -> torch.Tensor:
    """A padded batch (row 0 right-padded by an eighth, row 1 left-padded) or a packed one
    (skewed sequence lengths, ones included)."""
    if kind == "padded":
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[0, length - length // 8 :] = 0
        mask[1:, : length // 16 + 1] = 0
        return segments_of(mask, torch.arange(length).expand(batch, -1))
    generator, rows = torch.Generator().manual_seed(1), []
    for _ in range(batch):
        lengths = []
        while sum(lengths) < length:
            lengths.append(int(torch.randint(1, max(2, length // 3), (1,), generator=generator)))
        lengths[-1] -= sum(lengths) - length
        rows.append(torch.cat([torch.arange(n) for n in lengths if n > 0]))
    return segments_of(None, torch.stack(rows))


def ring(blocks, q, k, v, dout, segments, size, only_rank=None):
    """Every rank's blocks, forward and backward, as the ring runs them: (out, dq, dk, dv)
    of the whole sequence, in float32. ``only_rank`` runs that rank alone (for timing)."""
    batch, heads, length, dim = q.shape
    kv, scale = k.shape[1], dim**-0.5
    grouped, dout = (t.view(batch, kv, heads // kv, length, dim) for t in (q, dout))
    out = torch.zeros(grouped.shape, dtype=torch.float32, device=q.device)
    dq = torch.zeros_like(out)
    dk, dv = torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)
    for rank in range(size) if only_rank is None else [only_rank]:
        layout = RingLayout(None, size, rank, segments)
        mine = layout.positions(rank)
        acc = out.new_zeros(grouped[..., mine, :].shape)
        lse = acc.new_full(acc.shape[:-1], float("-inf"))
        for source in range(size):
            keys = layout.positions(source)
            key, value = k[:, :, keys], v[:, :, keys]
            block = blocks.forward(
                layout, source, grouped[..., mine, :], key, value, scale, acc.dtype
            )
            if block is not None:
                acc, lse = merge(acc, lse, *block)
        out[..., mine, :] = acc
        for source in range(size):
            keys = layout.positions(source)
            grad_out, query = dout[..., mine, :].to(acc.dtype), grouped[..., mine, :]
            key, value = k[:, :, keys], v[:, :, keys]
            grads = blocks.backward(layout, source, grad_out, query, key, value, acc, lse, scale)
            if grads is not None:
                dq[..., mine, :] += grads[0]
                dk[:, :, keys] += grads[1]
                dv[:, :, keys] += grads[2]
    return out.view(q.shape), dq.view(q.shape), dk, dv


def relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-6))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(blocks, inputs, segments, size, iters: int) -> float:
    """Milliseconds for rank 0's blocks (one layer, forward and backward)."""
    ring(blocks, *inputs, segments, size, only_rank=0)
    _sync(inputs[0].device)
    start = time.perf_counter()
    for _ in range(iters):
        ring(blocks, *inputs, segments, size, only_rank=0)
    _sync(inputs[0].device)
    return (time.perf_counter() - start) / iters * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tol", type=float, default=2e-2)
    parser.add_argument("--tokens", type=int, default=8192, help="row length (full shapes)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="toy shapes (CPU dry runs)")
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("check_ring_attention_gpu: no CUDA GPU here (--device cpu --small runs on CPU)")
            return 2
        if "flash_attn" not in registry.backends(OP, device):
            print("SKIP ring attention flash path: flash-attn is not installed")
            return 0
        kernels = registry.select(OP, device), registry.select(BACKWARD_OP, device)
        dtype, backend = torch.bfloat16, "flash_attn"
    else:  # the references stand in for the kernels
        kernels = registry._references[OP], registry._references[BACKWARD_OP]
        dtype, backend = torch.float32, "torch"
    shape, length = (SMALL, 48) if args.small else (FULL, args.tokens)
    failed = False
    for size in (2, 4):
        for kind in ("padded", "packed"):
            name = f"cp{size} {kind} [{backend}] {shape} x {length} tokens"
            try:
                generator = torch.Generator().manual_seed(size)
                b, h, hkv, d = shape["batch"], shape["heads"], shape["kv_heads"], shape["head_dim"]
                shapes = [(b, h, length, d), (b, hkv, length, d), (b, hkv, length, d)]
                made = [torch.randn(s, generator=generator) for s in [*shapes, shapes[0]]]
                inputs = [t.to(device, dtype) for t in made]
                row = segments(kind, b, length).to(device)
                got = ring(FlashBlocks(*kernels), *inputs, row, size)
                expected = ring(TorchBlocks(), *(t.float() for t in inputs), row, size)
                # Only real tokens' outputs and query gradients count: padding's are never read.
                real = (row >= 0)[:, None, :, None]
                errors = [relative_error(got[i] * real, expected[i] * real) for i in (0, 1)]
                errors += [relative_error(got[i], expected[i]) for i in (2, 3)]
                flash_ms = timed(FlashBlocks(*kernels), inputs, row, size, args.iters)
                torch_ms = timed(TorchBlocks(), [t.float() for t in inputs], row, size, args.iters)
                ok = max(errors) <= args.tol
                failed |= not ok
                status = "PASS" if ok else "FAIL"
                listed = ", ".join(f"{e:.1e}" for e in errors)
                print(
                    f"{status} {name}: errors out/dq/dk/dv {listed} (tolerance {args.tol:.0e}); "
                    f"rank 0, one layer fwd+bwd: flash blocks {flash_ms:.1f} ms, torch blocks "
                    f"{torch_ms:.1f} ms",
                    flush=True,
                )
            except Exception as exc:  # a kernel that raises fails its case, named
                failed = True
                print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
                print(traceback.format_exc(), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
