"""What TransformersModel costs over a hand-written PyTorch loop: step time and peak memory.

Both sides train the same model on the same collated batch (the tensors InputProcessor
makes from the InputFeatures a DataLoader yields; collation is a cost every loop pays, so it
is timed on its own and kept out of both steps), float32 on the CPU:

* **twinkle**: ``model.forward_backward(inputs=batch)`` then ``model.clip_grad_and_step()``:
  label logps, the loss, the training metrics and the one-place gradient normalisation are
  inside the measured step;
* **plain**: the Hugging Face model (built from the same seed: identical weights), the same
  peft LoRA config, AdamW with the same parameter groups (no decay on 1-D parameters) and the
  same gradient checkpointing setting: forward, ``F.cross_entropy`` summed over the label
  tokens and divided by their count, backward, clip to norm 1, step, zero_grad.

Models: ``bundled://tiny-qwen3`` (0.3M parameters; batch of 8 rows), and a 31M-parameter
Qwen3-shaped model built from a ``Qwen3Config`` (hidden 512, 10 layers; batch of 4 rows),
both random init, on rows of the bundled self-cognition set encoded with the bundled
template. Each combination of LoRA (r=8, all-linear) or full training and gradient
checkpointing off or on is timed in one process in rounds of two runs, one per side, in
alternating order (twinkle then plain, plain then twinkle, ...); a run is ``--steps`` steps
after a warm-up, and half the rounds run on a second pair of models built in the other
order (see ``time_variant``). The table shows each side's median per-step time and the
median over the rounds of the twinkle/plain ratio (target <= 1.03x).

Peak memory, on the 31M model: each variant runs in a fresh process, loads the same batch,
builds the model and trains 3 steps; the table shows the resident set before the first step
(imports, model, optimizer), the peak (``VmHWM``) and the ratio of the peaks (target <=
1.10x). The plain side imports torch, transformers and peft only. The tiny model is left
out: its few MiB of training state vanish in the ~900 MiB that the imports take.

    .venv/bin/python benchmarks/bench_model_overhead.py [--rounds 8] [--steps 3]

Threads: ``OMP_NUM_THREADS`` defaults to the number of CPUs, set before torch loads.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

import torch  # noqa: E402  (after OMP_NUM_THREADS is set)
import torch.nn.functional as F  # noqa: E402

TINY = "bundled://tiny-qwen3"
SMALL_CONFIG = dict(
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=10,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=64,
    tie_word_embeddings=True,
)
BATCH_ROWS = {"tiny": 8, "small": 4}
LR = 1e-4


# ---- the shared pieces: config, batch, LoRA ----------------------------------------------


def model_config(size: str):
    from transformers import AutoConfig, Qwen3Config

    from twinkle.hub import resolve_model

    tiny = AutoConfig.from_pretrained(resolve_model(TINY))
    if size == "tiny":
        return tiny
    return Qwen3Config(vocab_size=tiny.vocab_size, pad_token_id=tiny.pad_token_id, **SMALL_CONFIG)


def features(size: str) -> list:
    """The first rows of the bundled self-cognition set, encoded as a DataLoader yields them."""
    from twinkle.hub import resolve_dataset
    from twinkle.preprocessor import SelfCognitionProcessor
    from twinkle.template import build_template

    folder = resolve_dataset("bundled://self-cognition")
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    processor = SelfCognitionProcessor("Twinkle", "ModelScope")
    template = build_template("Qwen3_5Template", model_id=TINY)
    return template.batch_encode([processor(row) for row in rows[: BATCH_ROWS[size]]])


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=32, target_modules="all-linear")


# ---- the two sides ---------------------------------------------------------------------


class TwinkleSide:
    def __init__(self, config, lora: bool, checkpointing: bool, tensors: dict) -> None:
        from twinkle.model import TransformersModel

        self.model = TransformersModel(
            config=config, gradient_checkpointing=checkpointing, device="cpu"
        )
        if lora:
            self.model.add_adapter_to_model("default", lora_config())
        self.model.set_optimizer("AdamW", lr=LR)
        self.batch = tensors

    def step(self) -> float:
        loss = self.model.forward_backward(inputs=self.batch).loss
        self.model.clip_grad_and_step()
        return loss


class PlainSide:
    """A plain PyTorch training step, as one would write it by hand."""

    def __init__(self, config, lora: bool, checkpointing: bool, tensors: dict) -> None:
        from peft import get_peft_model
        from transformers import AutoModelForCausalLM

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # TransformersModel's default seed: the same initial weights
            model = AutoModelForCausalLM.from_config(config)
        if checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        model.config.use_cache = False
        if lora:
            model = get_peft_model(model, lora_config())
        model.train()
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in self.params if p.ndim >= 2]
        no_decay = [p for p in self.params if p.ndim < 2]
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=LR)
        self.inputs = {k: tensors[k] for k in ("input_ids", "attention_mask", "position_ids")}
        # logits[:, t] predict token t + 1: shift the labels left (not the logits, which
        # would copy them) and ignore the last position
        self.targets = F.pad(tensors["labels"][:, 1:], (0, 1), value=-100).reshape(-1)
        self.num_tokens = int((self.targets != -100).sum())

    def step(self) -> float:
        logits = self.model(**self.inputs).logits
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), self.targets, reduction="sum")
        (loss / self.num_tokens).backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach()) / self.num_tokens


def build(side: str, config, lora: bool, checkpointing: bool, tensors: dict):
    side_cls = TwinkleSide if side == "twinkle" else PlainSide
    return side_cls(config, lora, checkpointing, tensors)


def collate(batch: list) -> dict:
    from twinkle.processor import InputProcessor

    return InputProcessor(padding_side="right", pad_token_id=0)(batch)


# ---- step time: both sides in one process, alternating -------------------------------------


def time_collation(size: str, repeats: int = 50) -> float:
    """Median seconds InputProcessor takes to collate the batch (kept out of the steps)."""
    batch = features(size)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        collate(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_steps(side, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        side.step()
    return (time.perf_counter() - start) / steps


def time_variant(size: str, lora: bool, checkpointing: bool, rounds: int, steps: int) -> dict:
    """Median per-step times and the median per-round ratio, over two builds of the pair.

    Which model is built first shifts a side's step time by up to 5% either way (where its
    tensors land in memory; swapping the order swaps the sign), so half the rounds run on
    a pair built twinkle first and half on one built plain first.
    """
    tensors = collate(features(size))
    config = model_config(size)
    times: dict[str, list[float]] = {name: [] for name in SIDES}
    for order in (SIDES, SIDES[::-1]):
        sides = {name: build(name, config, lora, checkpointing, tensors) for name in order}
        first = {name: side.step() for name, side in sides.items()}  # warm-up; checks the loss
        if abs(first["twinkle"] - first["plain"]) > 1e-4 * abs(first["plain"]):
            raise RuntimeError(f"the two sides compute different losses: {first}")
        for r in range(max(1, rounds // 2)):
            for name in order if r % 2 == 0 else order[::-1]:
                times[name].append(time_steps(sides[name], steps))
        del sides
        gc.collect()
    # Each round's two runs are seconds apart and share the machine's load at the time, so
    # the ratio is taken per round: the median ratio resists load that drifts between rounds.
    ratios = [t / p for t, p in zip(times["twinkle"], times["plain"], strict=True)]
    return {
        **{name: statistics.median(values) for name, values in times.items()},
        "ratio": statistics.median(ratios),
    }


# ---- peak memory: each variant in a fresh process -------------------------------------------


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(side: str, lora: bool, checkpointing: bool, folder: str) -> None:
    """Build one side from the saved config and batch, train 3 steps; print its memory as JSON.

    The plain side imports nothing of Twinkle: only torch, transformers and peft.
    """
    from transformers import Qwen3Config

    config = Qwen3Config.from_json_file(Path(folder) / "config.json")
    model = build(side, config, lora, checkpointing, torch.load(Path(folder) / "tensors.pt"))
    before = _status_kib("VmRSS")
    for _ in range(3):
        model.step()
    print(json.dumps({"before_mib": before / 1024, "peak_mib": _status_kib("VmHWM") / 1024}))


def save_inputs(size: str, folder: Path) -> None:
    folder.mkdir()
    model_config(size).to_json_file(folder / "config.json")
    torch.save(collate(features(size)), folder / "tensors.pt")


def memory_variant(lora: bool, checkpointing: bool, folder: Path) -> dict:
    results = {}
    for side in SIDES:
        args = [sys.executable, __file__, "--child", side, str(lora), str(checkpointing)]
        done = subprocess.run(
            [*args, str(folder)], capture_output=True, text=True, check=False, timeout=600
        )
        if done.returncode != 0:
            raise RuntimeError(f"{side} child failed:\n{done.stderr[-2000:]}")
        results[side] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


# ---- the report ------------------------------------------------------------------------

SIDES = ("twinkle", "plain")
VARIANTS = [
    (size, lora, checkpointing)
    for size in ("tiny", "small")
    for lora in (True, False)
    for checkpointing in (False, True)
]


def label(size: str, lora: bool, checkpointing: bool) -> str:
    return f"| {size} | {'LoRA' if lora else 'full'} | {'on' if checkpointing else 'off'} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=8, help="runs of each side per variant")
    parser.add_argument("--steps", type=int, default=3, help="steps per run")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        side, lora, checkpointing, folder = args.child
        child(side, lora == "True", checkpointing == "True", folder)
        return

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs, "
        f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} · torch {torch.__version__} · "
        f"commit {commit or '?'}\n"
    )
    collation = ", ".join(f"{size} {1e3 * time_collation(size):.2f} ms" for size in BATCH_ROWS)
    print(f"Collating the batch with InputProcessor, outside both steps: {collation}\n")
    print("Step time, median of the runs (twinkle / plain; target <= 1.03x)\n")
    print("| model | training | grad ckpt | twinkle ms | plain ms | ratio |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for variant in VARIANTS:
        rounds, steps = args.rounds, args.steps
        if variant[0] == "tiny":  # tens of ms per step: more runs of more steps
            rounds, steps = 2 * rounds, 3 * steps
        t = time_variant(*variant, rounds=rounds, steps=steps)
        print(
            f"{label(*variant)} {1e3 * t['twinkle']:.1f} | {1e3 * t['plain']:.1f} | "
            f"{t['ratio']:.3f}x |",
            flush=True,
        )

    print("\nPeak memory, RSS in MiB, each variant in a fresh process (target <= 1.10x)\n")
    print(
        "| model | training | grad ckpt | twinkle before / peak | plain before / peak | "
        "peak ratio |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "small"
        save_inputs("small", folder)
        for variant in [v for v in VARIANTS if v[0] == "small"]:
            m = memory_variant(*variant[1:], folder)
            tw, pl = m["twinkle"], m["plain"]
            print(
                f"{label(*variant)} {tw['before_mib']:.0f} / {tw['peak_mib']:.0f} | "
                f"{pl['before_mib']:.0f} / {pl['peak_mib']:.0f} | "
                f"{tw['peak_mib'] / pl['peak_mib']:.3f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
