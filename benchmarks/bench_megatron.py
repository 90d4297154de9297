"""MegatronModel on the CPU: weight-conversion time, and step time per parallel layout.

A correctness harness here, not a speed claim: megatron-core runs on the CPU in
MegatronModel's CPU mode (``twinkle.model.megatron.cpu_mode``: its CUDA-bound calls
redirected), with gloo and float32.

1. **Conversion**, on a ~50M-parameter Qwen3-shaped model saved as safetensors (hidden 512,
   12 layers, vocab 32k, random init): Hugging Face -> Megatron (read each tensor, cut the
   tp shard, copy into the GPTModel) and Megatron -> Hugging Face (gather, split, write a
   safetensors folder), against ``from_pretrained`` and ``save_pretrained`` of the same
   folder as the baseline. Medians of ``--rounds`` runs; the round trip is checked exact.
2. **Step time**: one ``forward_backward`` + ``clip_grad_and_step`` on a 4-row batch of the
   bundled self-cognition set, on a Qwen3-shaped model (hidden 256, 4 layers, ~5M), for
   TransformersModel (1 process), MegatronModel tp1 (1 process) and tp2, tp2 with sequence
   parallel, pp2, dp2, cp2 (context parallel in our own attention: each rank holds half the
   sequence and all-gathers keys and values) (2 processes under torchrun,
   OMP_NUM_THREADS=1 each). ``--layouts`` picks some of them. Median over
   ``--steps`` steps after a warm-up; the ratio is against TransformersModel. The CPU
   mode hooks every torch call of the Megatron runs (a TorchFunctionMode), which
   TransformersModel does not pay.

    .venv/bin/python benchmarks/bench_megatron.py [--rounds 3] [--steps 5] \
        [--layouts "transformers,megatron tp1,megatron cp2"]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "packages" / "twinkle-models" / "tests"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CONVERSION_CONFIG = dict(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=12,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    vocab_size=32000,
    tie_word_embeddings=True,
)
STEP_CONFIG = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=32,
    tie_word_embeddings=True,
)
LAYOUTS = {
    "transformers": (1, {}),
    "megatron tp1": (1, {}),
    "megatron tp2": (2, {"tp_size": 2}),
    "megatron tp2+sp": (2, {"tp_size": 2, "sequence_parallel": True}),
    "megatron pp2": (2, {"pp_size": 2}),
    "megatron dp2": (2, {"dp_size": 2}),
    "megatron cp2": (2, {"cp_size": 2}),
}


def qwen3_config(**overrides):
    from transformers import AutoConfig

    from twinkle.hub import resolve_model

    config = AutoConfig.from_pretrained(resolve_model("bundled://tiny-qwen3"))
    layers = overrides.get("num_hidden_layers", config.num_hidden_layers)
    return config.__class__.from_dict(
        {**config.to_dict(), **overrides, "layer_types": ["full_attention"] * layers}
    )


# ---- 1. conversion -------------------------------------------------------------------------


def conversion(rounds: int) -> list[dict]:
    from twinkle.model.megatron.cpu_mode import cpu_mode

    with cpu_mode():  # the chunk is used directly, outside MegatronModel's methods
        return _conversion(rounds)


def _conversion(rounds: int) -> list[dict]:
    import torch
    from megatron.core import parallel_state
    from transformers import AutoModelForCausalLM

    from twinkle.model.megatron.build import build_gpt_chunks
    from twinkle.model.megatron.config import gpt_spec, transformer_config
    from twinkle.model.megatron.convert import (
        HFWeightReader,
        gather_hf_weights,
        load_hf_weights,
        write_hf_folder,
    )
    from twinkle.model.megatron.layout import MegatronLayout, initialize_parallel_state

    config = qwen3_config(**CONVERSION_CONFIG)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    layout = MegatronLayout()
    initialize_parallel_state(layout, 0, "gloo")
    spec = gpt_spec(config, 1)
    chunk = build_gpt_chunks(spec, transformer_config(spec, layout, "fp32", False), "cpu")[0]
    group = parallel_state.get_tensor_model_parallel_group()
    times: dict[str, list[float]] = {k: [] for k in ("to_megatron", "to_hf", "load", "save")}
    exact = True
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "hf"
        model.save_pretrained(source)
        original = model.state_dict()
        for index in range(rounds):
            start = time.perf_counter()
            load_hf_weights(chunk, spec, HFWeightReader(folder=source), 0, 1)
            times["to_megatron"].append(time.perf_counter() - start)
            out = Path(tmp) / f"export{index}"
            out.mkdir()
            start = time.perf_counter()
            weights = gather_hf_weights(chunk, spec, group)
            write_hf_folder(weights, config, out, 0, 1, True, [sorted(weights)])
            times["to_hf"].append(time.perf_counter() - start)
            exact &= all(torch.equal(weights[n], original[n]) for n in weights)
            start = time.perf_counter()
            loaded = AutoModelForCausalLM.from_pretrained(source)
            times["load"].append(time.perf_counter() - start)
            start = time.perf_counter()
            loaded.save_pretrained(Path(tmp) / f"saved{index}")
            times["save"].append(time.perf_counter() - start)
    median = {k: statistics.median(v) for k, v in times.items()}
    return [
        {
            "direction": "HF -> Megatron (read + shard + copy)",
            "seconds": median["to_megatron"],
            "baseline": median["load"],
            "params": params,
            "exact": exact,
        },
        {
            "direction": "Megatron -> HF (gather + split + write)",
            "seconds": median["to_hf"],
            "baseline": median["save"],
            "params": params,
            "exact": exact,
        },
    ]


# ---- 2. step time per layout ---------------------------------------------------------------


def worker(layout: str, steps: int, out: Path) -> None:
    import torch.distributed as dist
    from megatron_parallel import features

    from twinkle import DeviceMesh
    from twinkle.model import MegatronModel, TransformersModel

    config = qwen3_config(**STEP_CONFIG)
    feats = features()
    _, sizes = LAYOUTS[layout]
    if layout == "transformers":
        model = TransformersModel(config=config, device="cpu")
    else:
        mesh = DeviceMesh.from_sizes(device_type="cpu", **sizes)
        model = MegatronModel(config=config, device_mesh=mesh, device="cpu")
    mine = feats if "dp2" not in layout else feats[mesh.get_slice(len(feats))]
    model.set_optimizer("AdamW", lr=1e-4)
    times = []
    for step in range(steps + 1):
        start = time.perf_counter()
        model.forward_backward(mine)
        model.clip_grad_and_step(1.0)
        if step:
            times.append(time.perf_counter() - start)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        out.write_text(json.dumps({"layout": layout, "step": statistics.median(times)}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def step_times(steps: int, layouts: list[str]) -> list[dict]:
    rows = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": ""}
    for layout in layouts:
        procs, _ = LAYOUTS[layout]
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "result.json"
            args = [__file__, "--worker", layout, "--steps", str(steps), "--out", str(out)]
            if procs == 1:
                command = [sys.executable, *args]
            else:
                command = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    f"--nproc_per_node={procs}",
                    "--master-addr=127.0.0.1",
                    f"--master-port={_free_port()}",
                    *args,
                ]
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"{layout} failed:\n{done.stderr[-3000:]}")
            rows.append({**json.loads(out.read_text()), "procs": procs})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--worker")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--layouts", default=",".join(LAYOUTS), help="comma-separated, from: " + ", ".join(LAYOUTS)
    )
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, args.out)
        return
    from provenance import commit

    today, head = datetime.date.today().isoformat(), commit()
    layouts = [name.strip() for name in args.layouts.split(",")]
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown or "transformers" not in layouts:
        parser.error(f"--layouts must include 'transformers' and name only {list(LAYOUTS)}")
    steps = step_times(args.steps, layouts)
    convert = conversion(args.rounds)
    print("\n### Conversion, Qwen3-shaped ~50M (fp32, one process)\n")
    print("| date | commit | direction | params | time | baseline | ratio | exact |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | --- |")
    for row in convert:
        print(
            f"| {today} | {head} | {row['direction']} | {row['params'] / 1e6:.1f}M | "
            f"{row['seconds']:.2f} s | {row['baseline']:.2f} s | "
            f"{row['seconds'] / row['baseline']:.2f}x | {row['exact']} |"
        )
    print("\nBaselines: transformers' from_pretrained and save_pretrained of the same folder.")
    print("\n### Step time per layout, Qwen3-shaped ~5M, 4 rows (fp32, CPU, gloo)\n")
    print("| date | commit | layout | processes | step | vs TransformersModel |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    base = next(r["step"] for r in steps if r["layout"] == "transformers")
    for row in steps:
        print(
            f"| {today} | {head} | {row['layout']} | {row['procs']} | "
            f"{row['step'] * 1e3:.1f} ms | {row['step'] / base:.2f}x |"
        )


if __name__ == "__main__":
    main()
