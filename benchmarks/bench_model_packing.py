"""The documents' SFT loop, unmodified, against a hand-written transformers + peft loop.

Both sides train the same model (same seed, float32, CPU) with the same LoRA (r=8,
all-linear), AdamW and cosine schedule on the same rows in the same order, 8 rows a step:

* **twinkle**: the single-GPU loop of the user guide as written: ``DataLoader(dataset,
  batch_size=8)``, ``model.forward_backward(inputs=batch)``, ``model.clip_grad_and_step()``;
  no processor is set, so the model picks padded or padding-free batches itself;
* **hand**: a padded loop one writes by hand: pad each batch to its longest row,
  ``model(input_ids, attention_mask)``, summed cross-entropy over the label tokens divided
  by their count, backward, clip to 1, step, schedule, zero_grad. Collation is inside the
  timed loop on both sides.

Rows are random token ids, every token labelled, with lengths that are
``skewed`` (log-normal, median ``--median-length``, sigma 1, clipped to [8, --max-length],
as chat data is), ``uniform`` (every row ``--uniform-length`` tokens) or ``single`` (the
skewed rows one per step, batch_size=1). Models: ``bundled://tiny-qwen3`` (0.3M
parameters), a 27M and a ~50M Qwen3 (hidden 512; 8 and 16 layers).

Each round runs one pass of each side, alternating which goes first; the table shows
each side's median tokens/s (real tokens, padding excluded) and the median of the
per-round ratios, by the wall clock and by the CPU time of the process
(``time.process_time``), which a machine shared with other jobs disturbs less. Targets:
>= 1.5x tokens/s on skewed lengths, >= 0.97x (<= 1.03x time) on uniform and single rows.
The first loss of both sides must agree (same weights, same rows), so the sides train the
same thing. ``--compile`` adds a side with ``TransformersModel(compile=True)`` (inductor;
minutes of compilation on a CPU, excluded from its timing by a warm-up pass).

Peak memory: each side in a fresh process on the 27M model trains the skewed and the
uniform batches; the table shows the resident set before the first step and the peak
(``VmHWM``), and their ratio.

    .venv/bin/python benchmarks/bench_model_packing.py [--rounds 5] [--models tiny,27m,50m]

Threads: ``OMP_NUM_THREADS`` defaults to 1 (the CPU time then counts work, not spinning).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from provenance import commit  # noqa: E402

TINY = "bundled://tiny-qwen3"
SIZES = {"27m": 8, "50m": 16}  # layers of the hidden-512 Qwen3s
STEPS = {"tiny": 12, "27m": 3, "50m": 2}  # steps per pass: smaller passes for larger models
BATCH = 8
LR = 1e-4
LABELS = {"tiny": "tiny-qwen3 0.3M", "27m": "Qwen3 27M", "50m": "Qwen3 50M"}


def model_config(name: str):
    from transformers import AutoConfig, Qwen3Config

    from twinkle.hub import resolve_model

    tiny = AutoConfig.from_pretrained(resolve_model(TINY))
    if name == "tiny":
        return tiny
    return Qwen3Config(
        vocab_size=tiny.vocab_size,
        pad_token_id=0,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=SIZES[name],
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        tie_word_embeddings=True,
    )


def rows(kind: str, count: int, vocab: int, args) -> list[dict]:
    rng = np.random.default_rng(0)
    if kind == "uniform":
        lengths = np.full(count, args.uniform_length)
    else:
        drawn = rng.lognormal(np.log(args.median_length), 1.0, count).astype(int)
        lengths = np.clip(drawn, 8, args.max_length)
    return [
        {"input_ids": ids, "labels": ids}
        for ids in (rng.integers(1, vocab, n).tolist() for n in lengths)
    ]


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=32, target_modules="all-linear")


# ---- the two loops ---------------------------------------------------------------------


class DocumentsLoop:
    """The user guide's single-GPU loop, with the bundled data swapped for these rows."""

    def __init__(self, config, data: list[dict], batch_size: int, compile: bool = False) -> None:
        from twinkle.dataloader import DataLoader
        from twinkle.model import TransformersModel

        self.dataloader = DataLoader(dataset=data, batch_size=batch_size)
        self.model = TransformersModel(config=config, device="cpu", compile=compile)
        self.model.add_adapter_to_model("default", lora_config(), gradient_accumulation_steps=1)
        self.model.set_optimizer(optimizer_cls="AdamW", lr=LR)
        self.model.set_lr_scheduler(
            scheduler_cls="CosineWarmupScheduler",
            num_warmup_steps=5,
            num_training_steps=len(self.dataloader),
        )

    def one_pass(self, steps: int | None = None) -> float:
        first = None
        for step, batch in enumerate(self.dataloader):
            out = self.model.forward_backward(inputs=batch)
            self.model.clip_grad_and_step()
            first = out.loss if first is None else first
            if steps is not None and step + 1 == steps:
                self.dataloader.resume_from_checkpoint(0)  # the next pass starts the epoch
                break
        return first


class HandLoop:
    """A padded transformers + peft loop as one writes it by hand."""

    def __init__(self, config, data: list[dict], batch_size: int) -> None:
        from peft import get_peft_model
        from transformers import AutoModelForCausalLM, get_cosine_schedule_with_warmup

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # TransformersModel's default seed: the same base weights
            model = AutoModelForCausalLM.from_config(config)
        model.config.use_cache = False
        self.model = get_peft_model(model, lora_config())
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        decay = [p for p in self.params if p.ndim >= 2]
        no_decay = [p for p in self.params if p.ndim < 2]
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=LR)
        self.batches = [data[i : i + batch_size] for i in range(0, len(data), batch_size)]
        self.scheduler = get_cosine_schedule_with_warmup(self.optimizer, 5, len(self.batches))

    @staticmethod
    def collate(batch: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        width = max(len(row["input_ids"]) for row in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for i, row in enumerate(batch):
            n = len(row["input_ids"])
            ids[i, :n] = torch.tensor(row["input_ids"])
            mask[i, :n] = 1
            labels[i, 1:n] = torch.tensor(row["labels"][1:])
        return ids, mask, labels

    def one_pass(self, steps: int | None = None) -> float:
        first = None
        for step, batch in enumerate(self.batches):
            ids, mask, labels = self.collate(batch)
            logits = self.model(input_ids=ids, attention_mask=mask).logits
            targets = labels[:, 1:].reshape(-1)
            loss_sum = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), targets, reduction="sum"
            )
            tokens = int((targets != -100).sum())
            (loss_sum / tokens).backward()
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            first = float(loss_sum.detach()) / tokens if first is None else first
            if steps is not None and step + 1 == steps:
                break
        return first


# ---- timing -------------------------------------------------------------------------------


def measure(name: str, kind: str, args) -> dict:
    config = model_config(name)
    batch_size = 1 if kind == "single" else BATCH
    steps = STEPS[name] * (BATCH if kind == "single" else 1)
    data = rows(kind, steps * batch_size, config.vocab_size, args)
    tokens = sum(len(r["input_ids"]) for r in data)
    sides = {
        "twinkle": DocumentsLoop(config, data, batch_size),
        "hand": HandLoop(config, data, batch_size),
    }
    if args.compile:
        sides["compiled"] = DocumentsLoop(config, data, batch_size, compile=True)
    first = {side: loop.one_pass(steps=1) for side, loop in sides.items()}  # warm-up
    if abs(first["twinkle"] - first["hand"]) > 1e-4 * abs(first["hand"]):
        raise RuntimeError(f"the loops compute different first losses: {first}")
    if args.compile:
        sides["compiled"].one_pass()  # compiles every length of the pass
    rates = {(side, clock): [] for side in sides for clock in ("wall", "cpu")}
    for index in range(args.rounds):
        order = list(sides) if index % 2 == 0 else list(reversed(sides))
        for side in order:
            wall, cpu = time.perf_counter(), time.process_time()
            sides[side].one_pass()
            rates[side, "wall"].append(tokens / (time.perf_counter() - wall))
            rates[side, "cpu"].append(tokens / (time.process_time() - cpu))
    width_slots = sum(
        len(b) * max(len(r["input_ids"]) for r in b)
        for b in (data[i : i + batch_size] for i in range(0, len(data), batch_size))
    )

    def ratio(side: str, clock: str) -> float:
        pairs = zip(rates[side, clock], rates["hand", clock], strict=True)
        return statistics.median(a / b for a, b in pairs)

    return {
        "params": sum(p.numel() for p in sides["hand"].model.parameters()),
        "tokens": tokens,
        "padding": 1 - tokens / width_slots,
        "rates": {key: statistics.median(values) for key, values in rates.items()},
        "ratios": {
            (side, clock): ratio(side, clock)
            for side in sides
            if side != "hand"
            for clock in ("wall", "cpu")
        },
    }


# ---- peak memory: each side in a fresh process ----------------------------------------------


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(side: str, kind: str, args) -> None:
    config = model_config("27m")
    data = rows(kind, 2 * BATCH, config.vocab_size, args)
    loop = (DocumentsLoop if side == "twinkle" else HandLoop)(config, data, BATCH)
    before = _status_mib("VmRSS")
    loop.one_pass()
    print(json.dumps({"before": before, "peak": _status_mib("VmHWM")}))


def memory(side: str, kind: str, argv: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, *argv, "--child", side, kind],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{side} {kind} child failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="tiny,27m,50m")
    parser.add_argument("--kinds", default="skewed,uniform,single")
    parser.add_argument("--median-length", type=int, default=48)
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--uniform-length", type=int, default=96)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, args)
        return
    torch.manual_seed(0)
    load = os.getloadavg()
    print(
        f"{datetime.date.today()} · {platform.machine()}, {os.cpu_count()} CPUs, load "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} · torch {torch.__version__}, "
        f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} · commit {commit()}\n"
    )
    print(
        f"Rows: skewed log-normal (median {args.median_length}, clipped to [8, "
        f"{args.max_length}]), uniform ({args.uniform_length} tokens), single (skewed, one "
        f"a step). Tokens/s of real tokens, medians of {args.rounds} interleaved rounds.\n"
    )
    compiled = " | compiled ratio wall (cpu)" if args.compile else ""
    print(
        "| model | rows | padding | hand tok/s wall (cpu) | twinkle tok/s wall (cpu) | "
        f"ratio wall | ratio cpu{compiled} |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if args.compile else ""))
    for name in args.models.split(","):
        for kind in args.kinds.split(","):
            r = measure(name, kind, args)
            rates, ratios = r["rates"], r["ratios"]
            extra = ""
            if args.compile:
                extra = f" {ratios['compiled', 'wall']:.2f}x ({ratios['compiled', 'cpu']:.2f}x) |"
            print(
                f"| {LABELS[name]} ({r['params'] / 1e6:.1f}M) | {kind} | "
                f"{100 * r['padding']:.0f}% | {rates['hand', 'wall']:,.0f} "
                f"({rates['hand', 'cpu']:,.0f}) | {rates['twinkle', 'wall']:,.0f} "
                f"({rates['twinkle', 'cpu']:,.0f}) | {ratios['twinkle', 'wall']:.2f}x | "
                f"{ratios['twinkle', 'cpu']:.2f}x |{extra}",
                flush=True,
            )
    if args.no_memory:
        return
    print("\nPeak memory, Qwen3 27M, RSS in MiB, each side in a fresh process\n")
    print("| rows | hand before / peak | twinkle before / peak | peak ratio |")
    print("| --- | ---: | ---: | ---: |")
    argv = [f"--median-length={args.median_length}", f"--max-length={args.max_length}"]
    argv.append(f"--uniform-length={args.uniform_length}")
    for kind in ("skewed", "uniform"):
        hand, mine = memory("hand", kind, argv), memory("twinkle", kind, argv)
        print(
            f"| {kind} | {hand['before']:.0f} / {hand['peak']:.0f} | {mine['before']:.0f} / "
            f"{mine['peak']:.0f} | {mine['peak'] / hand['peak']:.3f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
