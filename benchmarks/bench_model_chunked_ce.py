"""Peak memory and time of one cross-entropy loss step: chunked against full logits.

One step is forward and backward of the loss with respect to the hidden states and the
lm_head weight, at vocab 150,000 and 4,096 tokens (batch 1, every position labelled: the
SFT worst case; RL batches with long prompts gain more, since prompt positions get no
logits at all), float32 on the CPU. Three variants:

* ``torch F.cross_entropy``: ``hidden @ weight.T`` then ``F.cross_entropy`` (reference);
* ``CrossEntropyLoss``: the same logits through ``twinkle.loss.CrossEntropyLoss``;
* ``ChunkedCrossEntropyLoss``: hidden states and weight, default chunk size.

Each measurement runs in a fresh process. Memory is the peak resident set during the step
minus the resident set after the inputs are allocated: the child resets the kernel's
high-water mark (``/proc/self/clear_refs``) before the step and reads ``VmHWM`` after it,
falling back to ``ru_maxrss`` where the reset is not allowed. Variants are interleaved
across runs; the table shows medians. The hidden size (256 by default) only scales the
matmul time, not the logits' memory, and keeps the run within about two minutes on two
cores.

    .venv/bin/python benchmarks/bench_model_chunked_ce.py [--runs 3] [--hidden 256]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

from provenance import commit

VOCAB = 150_000
TOKENS = 4096
VARIANTS = ("torch F.cross_entropy", "CrossEntropyLoss", "ChunkedCrossEntropyLoss")


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    """Reset the peak-RSS mark so VmHWM measures the step alone; False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def child(variant: str, hidden_size: int) -> None:
    """One loss step of ``variant``; prints a JSON line with its memory and time."""
    import torch
    import torch.nn.functional as F

    from twinkle.loss import ChunkedCrossEntropyLoss, CrossEntropyLoss, default_chunk_size

    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, TOKENS, hidden_size, generator=gen).mul_(0.1).requires_grad_()
    weight = torch.randn(VOCAB, hidden_size, generator=gen).mul_(0.1).requires_grad_()
    labels = torch.randint(0, VOCAB, (1, TOKENS), generator=gen)

    def step() -> torch.Tensor:
        if variant == "ChunkedCrossEntropyLoss":
            outputs = {"hidden_states": hidden, "lm_head_weight": weight}
            return ChunkedCrossEntropyLoss()({"labels": labels}, outputs)["loss"]
        logits = hidden @ weight.T
        if variant == "CrossEntropyLoss":
            return CrossEntropyLoss()({"labels": labels}, {"logits": logits})["loss"]
        return F.cross_entropy(logits[0, :-1], labels[0, 1:], reduction="sum")

    baseline = _status_kib("VmRSS")
    exact = _reset_peak()
    start = time.perf_counter()
    loss = step()
    loss.backward()
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert torch.isfinite(loss) and weight.grad is not None and hidden.grad is not None
    result = {
        "peak_mib": (peak - baseline) / 1024,
        "seconds": seconds,
        "loss": loss.item(),
        "exact_peak": exact,
        "chunk_size": default_chunk_size(VOCAB),
    }
    print(json.dumps(result))


def measure(variant: str, hidden_size: int) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, "--hidden", str(hidden_size)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each variant")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.hidden)
        return 0

    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for _ in range(args.runs):
        for variant in VARIANTS:
            results[variant].append(measure(variant, args.hidden))
    losses = [r["loss"] for runs in results.values() for r in runs]
    if max(losses) - min(losses) > 1e-4 * abs(losses[0]):
        raise RuntimeError(f"the variants disagree on the loss: {losses}")
    peak = {v: statistics.median(r["peak_mib"] for r in runs) for v, runs in results.items()}
    secs = {v: statistics.median(r["seconds"] for r in runs) for v, runs in results.items()}
    reference = VARIANTS[0]
    first = results[reference][0]
    method = "VmHWM after clear_refs" if first["exact_peak"] else "ru_maxrss"
    print(
        f"# bench_model_chunked_ce: {datetime.date.today()}, {platform.platform()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}, commit {commit()}\n"
    )
    print(
        f"Loss step (forward + backward to hidden states and lm_head weight), float32, "
        f"batch 1, {TOKENS} tokens all labelled, vocab {VOCAB}, hidden {args.hidden}, "
        f"chunk {first['chunk_size']} tokens. Peak RSS over the inputs ({method}); medians "
        f"of {args.runs} fresh processes per variant.\n"
    )
    print("| variant | peak memory (MiB) | vs reference | step time (s) | vs reference |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for variant in VARIANTS:
        print(
            f"| {variant} | {peak[variant]:.0f} | {peak[variant] / peak[reference]:.2f}× "
            f"| {secs[variant]:.2f} | {secs[variant] / secs[reference]:.2f}× |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
