"""The one GPU validation run (issue 20): every GPU path of the workspace, on one CUDA GPU.

Runs each check of ``CHECKS`` as its own process, under its own time limit, in order, and
keeps going when one fails; prints a summary and appends it, with each check's tables and
result lines, to ``--results`` (benchmarks/RESULTS.md). Exits non-zero when any check
failed. ``benchmarks/gpu/validate.sh`` installs the GPU extras first and then runs this.

1. ``kernels``: every kernel fast path against its torch reference; fused linear
   cross-entropy memory and time (``check_kernels_gpu.py``);
2. ``gated_delta``: flash-linear-attention's varlen kernels (``bench_gated_delta_gpu.py``);
3. ``vllm_lora``: vLLMSampler samples, its logprobs equal the trainer's, full and LoRA
   weight sync in process (``tests/gpu/check_vllm_sampler.py``, on a random Qwen3-0.6B-shaped
   folder: the machine has no hub);
4. ``weight_sync``: a Qwen3-8B-shaped trainer -> vLLM, full and LoRA-only, timed
   (``check_weight_sync_gpu.py``; NCCL when two GPUs are visible);
5. ``fsdp2``: FSDP2 training on CUDA (``bench_fsdp_gpu.py``, one rank, 8 layers);
6. ``sft_mfu``: tokens/s and MFU of full SFT of a Qwen3-4B-shaped model at bf16
   (``bench_model_gpu.py``);
7. ``ring_flash``: ring attention's blocks through flash-attn against the torch blocks, every
   rank of rings of 2 and 4 in one process, padded and packed (``check_ring_attention_gpu.py``);
8. ``agentic_vllm``: MultiTurnRollout around vLLMSampler, the trainer's logprobs of the
   multi-turn sequences against vLLM's, and DecoupledPPOLoss on them
   (``check_agentic_vllm_gpu.py``).

    python benchmarks/gpu/validate.py [--only kernels,sft_mfu] [--dry-run]

``--dry-run`` checks without a GPU that every script exists and compiles, builds the model
configs, and prints the plan; the CPU test ``test_gpu_validation_scripts.py`` runs it.
The time limits add up to 930 s (15.5 minutes); on an H200 the run should take under ten.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PY = sys.executable


@dataclass(frozen=True)
class Check:
    name: str
    script: Path
    args: tuple[str, ...]
    timeout_s: int
    needs: tuple[str, ...] = ()
    """Import names the check needs; missing ones make it a skip, said as such."""
    model: str | None = field(default=None)
    """A random model folder of this shape (with weights) to pass as ``--model-id``."""


CHECKS = (
    Check("kernels", HERE / "check_kernels_gpu.py", (), 150),
    Check("gated_delta", HERE / "bench_gated_delta_gpu.py", ("--iters", "5"), 90, ("fla",)),
    Check("vllm_lora", ROOT / "tests/gpu/check_vllm_sampler.py", (), 150, ("vllm",), "qwen3-0.6b"),
    Check("weight_sync", HERE / "check_weight_sync_gpu.py", ("--repeats", "3"), 180, ("vllm",)),
    Check("fsdp2", HERE / "bench_fsdp_gpu.py",
          ("--gpus", "1", "--layers", "8", "--steps", "4", "--warmup", "2"), 90),
    Check("sft_mfu", HERE / "bench_model_gpu.py",
          ("--variants", "full", "--steps", "6", "--warmup", "2"), 150),
    Check("ring_flash", HERE / "check_ring_attention_gpu.py", (), 60, ("flash_attn",)),
    Check("agentic_vllm", HERE / "check_agentic_vllm_gpu.py", (), 60, ("vllm",)),
)  # fmt: skip


def _missing(check: Check) -> list[str]:
    return [name for name in check.needs if importlib.util.find_spec(name) is None]


def _kept_lines(output: str) -> list[str]:
    """The lines worth keeping in RESULTS.md: tables, PASS/FAIL/SKIP/LOSS lines, JSON."""
    keep = ("|", "PASS", "FAIL", "SKIP", "LOSS", "{", '"')
    return [line for line in output.splitlines() if line.lstrip().startswith(keep)][-40:]


def run(check: Check, scratch: Path) -> dict:
    missing = _missing(check)
    if missing:
        return {"name": check.name, "status": "skipped", "why": f"needs {', '.join(missing)}"}
    args = list(check.args)
    if check.model is not None:
        sys.path.insert(0, str(HERE))
        from random_model import write

        args += ["--model-id", str(write(check.model, scratch / check.model, weights=True))]
    start = time.monotonic()
    try:
        done = subprocess.run(
            [PY, str(check.script), *args],
            capture_output=True,
            text=True,
            timeout=check.timeout_s,
            cwd=ROOT,
        )
        status = "passed" if done.returncode == 0 else f"failed (exit {done.returncode})"
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        status, output = f"failed (over {check.timeout_s} s)", f"{exc.stdout or ''}"
    seconds = time.monotonic() - start
    print(f"== {check.name}: {status} in {seconds:.0f} s", flush=True)
    print(output[-4000:], flush=True)
    return {"name": check.name, "status": status, "seconds": seconds, "lines": _kept_lines(output)}


def report(rows: list[dict]) -> str:
    import torch

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    lines = [
        f"\n## GPU validation · {datetime.date.today()} · {device} · torch {torch.__version__} "
        f"· commit {commit or '?'}\n",
        "Run by `benchmarks/gpu/validate.sh`; each check's own output below.\n",
        "| check | status | seconds |",
        "| --- | --- | ---: |",
    ]
    for row in rows:
        status = row["status"] + (f": {row['why']}" if "why" in row else "")
        lines.append(f"| {row['name']} | {status} | {row.get('seconds', 0):.0f} |")
    for row in rows:
        if row.get("lines"):
            lines += ["", f"`{row['name']}`:", "", "```text", *row["lines"], "```"]
    return "\n".join(lines) + "\n"


def dry_run(checks: list[Check]) -> int:
    """Everything but the GPU: the scripts exist and compile, the model configs build."""
    sys.path.insert(0, str(HERE))
    from random_model import SHAPES, config_of

    for shape in SHAPES:
        config = config_of(shape)
        print(f"config {shape}: {config.num_hidden_layers} layers, hidden {config.hidden_size}")
    for check in checks:
        compile(check.script.read_text(), str(check.script), "exec")
        command = " ".join([check.script.relative_to(ROOT).as_posix(), *check.args])
        extra = f", model {check.model}" if check.model else ""
        needs = f", needs {', '.join(check.needs)}" if check.needs else ""
        print(f"check {check.name}: {command} (limit {check.timeout_s} s{needs}{extra})")
    total = sum(c.timeout_s for c in checks)
    print(f"dry run: {len(checks)} checks, at most {total} s; nothing ran on a GPU")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="comma-separated check names")
    parser.add_argument("--results", type=Path, help="append the summary to this file")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    names = [c.name for c in CHECKS]
    chosen = args.only.split(",") if args.only else names
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        parser.error(f"unknown checks {unknown}; known: {', '.join(names)}")
    checks = [c for c in CHECKS if c.name in chosen]
    if args.dry_run:
        return dry_run(checks)
    import torch

    if not torch.cuda.is_available():
        print("validate.py: no CUDA GPU here; --dry-run checks the scripts without one")
        return 2
    with tempfile.TemporaryDirectory(prefix="twinkle-validate-") as scratch:
        rows = [run(check, Path(scratch)) for check in checks]
    summary = report(rows)
    print(summary)
    if args.results is not None:
        with args.results.open("a") as f:
            f.write(summary)
    return 0 if all(r["status"] in ("passed", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
