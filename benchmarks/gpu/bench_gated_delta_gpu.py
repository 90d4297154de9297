"""The varlen gated delta rule and causal conv1d on one CUDA GPU: twinkle-kernels' torch
reference against flash-linear-attention's kernels, agreement and time.

Inputs are shaped like one Qwen3.5-4B GatedDeltaNet layer on a packed row: 16 query/key
heads and 32 value heads of 128, conv width 4, a row of ``--tokens`` tokens holding
sequences of skewed lengths (including length-1 ones). For each op both backends run the
same inputs, float32 for the agreement check (outputs and the gradients of a random linear
function of them; tolerance ``--tol``, relative to the reference's largest magnitude:
fla's chunked kernels accumulate in a different order and use TF32 where allowed), then
bf16 for timing: forward, and forward + backward, median of ``--iters`` runs after a
warm-up, timed with CUDA events.

    python benchmarks/gpu/bench_gated_delta_gpu.py [--tokens 8192] [--iters 10]

Needs a CUDA GPU and ``flash-linear-attention`` (the ``fla`` extra of twinkle-kernels);
refuses to run elsewhere. Not run in CI (no GPU there). About a minute on an H100/H200.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys

import torch

from twinkle.kernel import backends, causal_conv1d, chunk_gated_delta_rule

HEADS, VALUE_HEADS, HEAD_DIM, CONV_WIDTH = 16, 32, 128, 4


def skewed_cu_seqlens(total: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    lengths = [1, 1, 17]
    while sum(lengths) < total:
        length = torch.empty(1).log_normal_(5.0, 1.0, generator=generator).clamp(1, 4096)
        lengths.append(int(length))
    lengths[-1] -= sum(lengths) - total
    lengths = [n for n in lengths if n > 0]
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def gdn_inputs(tokens: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device="cuda", dtype=dtype)

    q, k = randn(1, tokens, HEADS, HEAD_DIM), randn(1, tokens, HEADS, HEAD_DIM)
    v = randn(1, tokens, VALUE_HEADS, HEAD_DIM)
    g = torch.nn.functional.logsigmoid(randn(1, tokens, VALUE_HEADS))
    beta = randn(1, tokens, VALUE_HEADS).sigmoid()
    return [x.requires_grad_() for x in (q, k, v, g, beta)]


def conv_inputs(tokens: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    channels = 2 * HEADS * HEAD_DIM + VALUE_HEADS * HEAD_DIM
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(1, tokens, channels, generator=generator, device="cuda", dtype=dtype)
    weight = torch.randn(channels, CONV_WIDTH, generator=generator, device="cuda", dtype=dtype)
    return [x.requires_grad_(), weight.requires_grad_()]


def run_gdn(inputs, cu_seqlens, backend):
    out, _ = chunk_gated_delta_rule(
        *inputs, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens, backend=backend
    )
    return out


def run_conv(inputs, cu_seqlens, backend):
    x, weight = inputs
    return causal_conv1d(x, weight, activation="silu", cu_seqlens=cu_seqlens, backend=backend)


def outputs_and_grads(run, inputs, cu_seqlens, backend):
    out = run(inputs, cu_seqlens, backend)
    probe = torch.randn(out.shape, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    grads = torch.autograd.grad((out.float() * probe).sum(), inputs)
    return [out.detach().float(), *(g.float() for g in grads)]


def relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return float((ours - reference).abs().max() / reference.abs().max().clamp_min(1e-12))


def time_ms(fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--tol", type=float, default=2e-3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU: the fla kernels run on CUDA only")
    device = torch.device("cuda")
    for op in ("chunk_gated_delta_rule", "causal_conv1d"):
        if "fla" not in backends(op, device):
            sys.exit("needs flash-linear-attention: pip install 'twinkle-kernels[fla]'")
    cu_seqlens = skewed_cu_seqlens(args.tokens).to(device)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(
        f"{datetime.date.today()} · {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"commit {commit.stdout.strip() or '?'}; {args.tokens} tokens in "
        f"{cu_seqlens.numel() - 1} sequences\n"
    )
    print(
        "| op | max relative error (out, grads) | ok | torch fwd ms | fla fwd ms | "
        "torch fwd+bwd ms | fla fwd+bwd ms | fwd+bwd speed-up |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    failed = False
    for name, run, make in (
        ("chunk_gated_delta_rule", run_gdn, gdn_inputs),
        ("causal_conv1d", run_conv, conv_inputs),
    ):
        exact = make(args.tokens, torch.float32)
        reference = outputs_and_grads(run, exact, cu_seqlens, "torch")
        fast = outputs_and_grads(run, exact, cu_seqlens, "fla")
        errors = [relative_error(a, b) for a, b in zip(fast, reference, strict=True)]
        ok = max(errors) <= args.tol
        failed |= not ok
        timed = make(args.tokens, torch.bfloat16)
        row = {}
        for backend in ("torch", "fla"):

            def forward(run=run, timed=timed, backend=backend):
                return run(timed, cu_seqlens, backend)

            row[backend, "fwd"] = time_ms(forward, args.iters)

            def forward_backward(forward=forward):
                forward().float().sum().backward()

            row[backend, "bwd"] = time_ms(forward_backward, args.iters)
        print(
            f"| {name} | {', '.join(f'{e:.1e}' for e in errors)} | {'yes' if ok else 'NO'} | "
            f"{row['torch', 'fwd']:.2f} | {row['fla', 'fwd']:.2f} | {row['torch', 'bwd']:.2f} | "
            f"{row['fla', 'bwd']:.2f} | {row['torch', 'bwd'] / row['fla', 'bwd']:.1f}x |",
            flush=True,
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
