"""Every kernel fast path of twinkle-kernels against its torch reference, on one CUDA GPU.

For each op of ``twinkle.kernel`` whose fast path is installed here (liger-kernel: RMSNorm,
RoPE, SwiGLU, fused linear cross-entropy; flash-attn: varlen attention; torch's grouped_mm:
MoE grouped matmul), inputs shaped like one Qwen3-8B layer (or its lm_head at vocab 151,936)
run through the fast path in bf16 and through the reference on float32 copies: outputs and
the gradients of a random linear function of them must agree to ``--tol`` relative to the
reference's largest magnitude. A mismatch or an exception fails the script with the op, the
backend, the input shapes and the error. An op whose fast path is not installed is listed
as skipped (``--require-all`` makes that a failure). The gated delta rule and causal conv1d
are ``bench_gated_delta_gpu.py``'s.

Then the fused linear cross-entropy at vocab 151,936 against the unfused loss (the
reference: full logits) and twinkle's chunked head: peak memory above the inputs and
forward + backward time (issue 20's target: at most 0.2x the memory, at most 1.0x the time).

    python benchmarks/gpu/check_kernels_gpu.py [--tol 2e-2] [--require-all]

``--device cpu --small`` runs the same cases at toy shapes on a CPU, where every op takes
its reference (the CPU test ``test_gpu_validation_scripts.py`` does so), so the script cannot
rot unnoticed. About a minute on an H100/H200.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

from twinkle.kernel import backends, registry

# Qwen3-8B: hidden 4096, 32 query / 8 key-value heads of 128, MLP 12288, vocab 151,936.
FULL = {"tokens": 8192, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
        "mlp": 12288, "vocab": 151_936, "experts": 64, "expert_mlp": 1536}  # fmt: skip
SMALL = {"tokens": 24, "hidden": 16, "heads": 4, "kv_heads": 2, "head_dim": 8,
         "mlp": 32, "vocab": 50, "experts": 4, "expert_mlp": 8}  # fmt: skip


@dataclass
class Case:
    """One op's inputs: ``make(dtype)`` builds them, ``call(implementation, inputs)`` runs."""

    op: str
    make: Callable[[torch.dtype], dict[str, torch.Tensor]]
    call: Callable[[Callable, dict[str, torch.Tensor]], torch.Tensor | tuple]


def _lengths(total: int, generator: torch.Generator) -> torch.Tensor:
    """Skewed sequence lengths (ones included) summing to ``total``: a packed row."""
    lengths = []
    while sum(lengths) < total:
        lengths.append(int(torch.randint(1, max(2, total // 3), (1,), generator=generator)))
    lengths[-1] -= sum(lengths) - total
    return torch.tensor([n for n in lengths if n > 0])


def cases(shape: dict[str, int], device: torch.device) -> list[Case]:
    t, h, d = shape["tokens"], shape["hidden"], shape["head_dim"]
    q_heads, kv_heads, experts = shape["heads"], shape["kv_heads"], shape["experts"]

    def tensors(**shapes):
        def make(dtype):
            generator = torch.Generator().manual_seed(0)
            made = {k: torch.randn(*s, generator=generator) for k, s in shapes.items()}
            return {k: v.to(device=device, dtype=dtype) for k, v in made.items()}

        return make

    def bounds_and(make):
        def with_bounds(dtype):
            inputs = make(dtype)
            lengths = _lengths(t, torch.Generator().manual_seed(1))
            inputs["cu_seqlens"] = torch.cat([torch.zeros(1), lengths.cumsum(0)]).to(device).int()
            return inputs

        return with_bounds

    def experts_and(make):
        def with_sizes(dtype):
            inputs = make(dtype)
            owner = torch.randint(0, experts, (t,), generator=torch.Generator().manual_seed(2))
            inputs["group_sizes"] = torch.bincount(owner, minlength=experts).to(device)
            return inputs

        return with_sizes

    def targets_and(make):
        def with_targets(dtype):
            inputs = make(dtype)
            generator = torch.Generator().manual_seed(3)
            inputs["targets"] = torch.randint(0, shape["vocab"], (t,), generator=generator)
            inputs["targets"] = inputs["targets"].to(device)
            return inputs

        return with_targets

    return [
        Case("rms_norm", tensors(x=(t, h), weight=(h,)), lambda f, i: f(i["x"], i["weight"], 1e-6)),
        Case(
            "rotary_embedding",
            tensors(q=(1, q_heads, t, d), k=(1, kv_heads, t, d), cos=(1, t, d), sin=(1, t, d)),
            lambda f, i: f(i["q"], i["k"], i["cos"], i["sin"], 1),
        ),
        Case(
            "swiglu",
            tensors(gate=(t, shape["mlp"]), up=(t, shape["mlp"])),
            lambda f, i: f(i["gate"], i["up"]),
        ),  # fmt: skip
        Case(
            "fused_linear_cross_entropy",
            targets_and(tensors(hidden=(t, h), weight=(shape["vocab"], h))),
            lambda f, i: f(i["hidden"], i["weight"], i["targets"], None)[0],
        ),
        Case(
            "varlen_attention",
            bounds_and(tensors(q=(t, q_heads, d), k=(t, kv_heads, d), v=(t, kv_heads, d))),
            lambda f, i: f(
                i["q"], i["k"], i["v"], i["cu_seqlens"], int(i["cu_seqlens"].diff().max()), None
            ),
        ),
        Case(
            "grouped_matmul",
            experts_and(tensors(x=(t, h), weight=(experts, h, shape["expert_mlp"]))),
            lambda f, i: f(i["x"], i["weight"], i["group_sizes"]),
        ),
    ]


def _outputs_and_grads(case: Case, implementation: Callable, inputs: dict) -> list[torch.Tensor]:
    leaves = {k: v.detach().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    out = case.call(implementation, leaves)
    outs = list(out) if isinstance(out, tuple) else [out]
    generator = torch.Generator().manual_seed(4)
    probes = [torch.randn(o.shape, generator=generator).to(o.device, torch.float32) for o in outs]
    sum((o.float() * p).sum() for o, p in zip(outs, probes, strict=True)).backward()
    grads = [v.grad for v in leaves.values() if v.grad is not None]
    return [t.detach().float() for t in (*outs, *grads)]


def relative_error(fast: torch.Tensor, reference: torch.Tensor) -> float:
    scale = reference.abs().max().clamp_min(1e-6)
    return float((fast - reference).abs().max() / scale)


def check(case: Case, backend: str, dtype: torch.dtype, tol: float) -> dict:
    """The fast path in ``dtype`` against the reference in float32; a dict for the report."""
    inputs = case.make(dtype)
    shapes = {k: tuple(v.shape) for k, v in inputs.items()}
    row = {"op": case.op, "backend": backend, "shapes": shapes}
    try:
        exact = {k: v.float() if v.is_floating_point() else v for k, v in inputs.items()}
        reference = _outputs_and_grads(case, registry._references[case.op], exact)
        device = next(iter(inputs.values())).device
        fast = _outputs_and_grads(case, registry.select(case.op, device, backend), inputs)
        errors = [relative_error(a, b) for a, b in zip(fast, reference, strict=True)]
        row.update(errors=errors, ok=max(errors) <= tol)
        if not row["ok"]:
            row["error"] = f"max relative error {max(errors):.2e} > tolerance {tol:.0e}"
    except Exception as exc:  # a kernel that raises is a failure of its op, reported as such
        row.update(ok=False, error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc())
    return row


def memory_and_time(shape: dict[str, int], device: torch.device, iters: int) -> list[dict]:
    """The lm_head loss three ways: unfused (full logits), chunked, fused (when installed)."""
    from twinkle.loss.chunked_logps import chunked_linear_logps

    t, h, vocab = shape["tokens"], shape["hidden"], shape["vocab"]
    generator = torch.Generator().manual_seed(5)
    hidden = torch.randn(t, h, generator=generator).to(device, torch.bfloat16)
    weight = (torch.randn(vocab, h, generator=generator) * h**-0.5).to(device, torch.bfloat16)
    targets = torch.randint(0, vocab, (t,), generator=generator).to(device)
    ways = {
        "unfused": registry._references["fused_linear_cross_entropy"],
        "chunked": lambda x, w, y, b: chunked_linear_logps(x, w, y, b),
    }
    fast = backends("fused_linear_cross_entropy", device)[0]
    if fast != registry.REFERENCE:
        ways[f"fused ({fast})"] = registry._load("fused_linear_cross_entropy", fast)
    rows = []
    for name, implementation in ways.items():
        x, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()

        def step(implementation=implementation, x=x, w=w):
            implementation(x, w, targets, None)[0].sum().backward()

        step()
        _sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        start = time.perf_counter()
        for _ in range(iters):
            step()
        _sync(device)
        seconds = (time.perf_counter() - start) / iters
        peak = torch.cuda.max_memory_allocated() - base if device.type == "cuda" else 0
        rows.append({"loss": name, "ms": seconds * 1e3, "peak_gib": peak / 2**30})
    return rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tol", type=float, default=2e-2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="toy shapes (CPU dry runs)")
    parser.add_argument("--require-all", action="store_true", help="a missing fast path fails")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("check_kernels_gpu: no CUDA GPU here (use --device cpu --small for a dry run)")
        return 2
    shape = SMALL if args.small else FULL
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows, failed = [], False
    for case in cases(shape, device):
        backend = backends(case.op, device)[0]
        if backend == registry.REFERENCE and device.type == "cuda":
            needs = [p.package for p in registry._fast_paths[case.op]]
            rows.append({"op": case.op, "ok": None, "error": f"skipped: needs {needs}"})
            failed |= args.require_all
            print(f"SKIP {case.op}: no fast path installed (needs one of {needs})", flush=True)
            continue
        row = check(case, backend, dtype, args.tol)
        rows.append(row)
        failed |= not row["ok"]
        status = "PASS" if row["ok"] else "FAIL"
        detail = row.get("error") or f"errors {', '.join(f'{e:.1e}' for e in row['errors'])}"
        print(f"{status} {case.op} [{backend}] shapes {row['shapes']}: {detail}", flush=True)
        if not row["ok"] and "trace" in row:
            print(row["trace"], file=sys.stderr)
    losses = memory_and_time(shape, device, args.iters)
    for row in losses:
        print(f"LOSS {row['loss']}: {row['ms']:.1f} ms fwd+bwd, peak {row['peak_gib']:.2f} GiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ops": rows, "losses": losses}, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
