"""Agentic RL: MultiTurnRollout's throughput against a hand-written loop, and asynchronous
GRPO (max_staleness 1, 2) against synchronous on the bundled calculator task.

1. **Rollout**: the same warm-started tiny model and TorchSampler, the held-out tasks x 4
   trajectories, up to 3 turns of up to 64 tokens. ``MultiTurnRollout`` (token in, token
   out: appends the sampled tokens and the rendered observation) against the loop a user
   writes without it: keep the messages, let the sampler encode the whole conversation each
   turn (``sampler.sample(trajectories)``), parse with ``template.parse_response``, step
   the envs. Sampled tokens per second, medians of ``--repeats`` alternating runs, each
   repeat with a sampling seed of its own (the same for both loops); the ratio is the
   median of the per-repeat ratios. Target: ratio >= 1.0x.
2. **Async**: per seed (``--seeds 0,1,2``) one SFT warm start (``--sft-steps``), then
   ``--grpo-steps`` GRPO steps from the same weights for max_staleness 0 (synchronous), 1
   and 2, held-out success measured every ``--eval-every`` steps (evaluation time
   excluded). Reported per seed and as medians over seeds: the curve, GRPO wall seconds,
   the steps (and seconds) to the target success (half of that seed's synchronous gain
   over its warm start; "not reached" when a run stays below it), the trainer's idle
   fraction (waiting for a batch or for the sampler to finish one before a sync), the
   fraction of tokens the loss clips at a batch's first update, and the ratios to the
   sampler.
3. **Decoupled**: GRPOLoss against DecoupledPPOLoss at max_staleness
   ``--decoupled-staleness`` (2), for each ``--grpo-lr`` and ``--updates-per-batch`` (the
   optimizer steps per rollout batch, where the proximal policy's trust region acts), with
   the importance weights. The runs of a seed go in an order rotated by the seed.

    .venv/bin/python benchmarks/bench_agentic.py [--repeats 3] [--sft-steps 600]
    .venv/bin/python benchmarks/bench_agentic.py --parts rollout --repeats 5   # 1. only
    .venv/bin/python benchmarks/bench_agentic.py --parts async,decoupled --seeds 0,1,2 ...
    # ... --updates-per-batch 1,4 [--grpo-lr 1e-3,2.5e-4]: parts 2 and 3, every seed in turn
    # seeds side by side, then one table: --seeds 1 --json s1.json ... --merge s*.json

On this machine the producer is a thread sharing 2 cores with the trainer (and with
whoever else runs): the async figures measure that, not a cluster where the sampler has
its own devices.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import random
import socket
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np  # noqa: E402
from provenance import commit  # noqa: E402

from twinkle.checkpoint_engine import CheckpointEngineManager  # noqa: E402
from twinkle.data_format import Message, SamplingParams  # noqa: E402
from twinkle.env import EnvPool, StepResult, arithmetic_tasks  # noqa: E402
from twinkle.env.arithmetic import ArithmeticToolEnv  # noqa: E402
from twinkle.sampler import TorchSampler  # noqa: E402

RECIPE = Path(__file__).parents[1] / "cookbook" / "agentic" / "grpo_calculator.py"
PARAMS = SamplingParams(max_tokens=64, temperature=1.0, seed=11)


def load_recipe():
    spec = importlib.util.spec_from_file_location("grpo_calculator", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def turn_seed(seed: int, turn: int) -> int:
    """The seed MultiTurnRollout gives a turn's (first) sampler call, so both loops sample
    the same tokens wherever the re-encoded conversation is the appended token list."""
    words = np.random.SeedSequence([seed, turn, 0])
    return int(words.generate_state(1, np.uint64)[0] >> np.uint64(2))


def hand_written_rollout(sampler, tasks, num_samples: int, max_turns: int, seed: int) -> int:
    """The loop without MultiTurnRollout; returns the sampled tokens it generated."""
    envs = EnvPool(ArithmeticToolEnv, describe_tools=False, max_workers=1)
    runs = [task for task in tasks for _ in range(num_samples)]
    conversations = {i: list(e.observation) for i, e in enumerate(envs.reset(runs))}
    sampled = 0
    for turn in range(max_turns):
        if not conversations:
            break
        live = list(conversations)
        params = SamplingParams(**{**PARAMS.to_dict(), "seed": turn_seed(seed, turn)})
        responses = sampler.sample([{"messages": conversations[i]} for i in live], params)
        actions = {}
        for index, response in zip(live, responses, strict=True):
            sequence = response.sequences[0]
            sampled += len(sequence.tokens)
            try:
                message = Message.model_validate(sampler.template.parse_response(sequence.text))
            except ValueError as err:
                conversations[index] += [
                    Message(role="assistant", content=sequence.text),
                    Message(role="tool", content=f"error: {err}"),
                ]
                continue
            conversations[index].append(message)
            if sequence.stop_reason != "stop":
                del conversations[index]
            else:
                actions[index] = message
        for index, outcome in envs.step(actions).items():
            if not isinstance(outcome, StepResult) or outcome.done or turn + 1 == max_turns:
                conversations.pop(index, None)
            else:
                conversations[index] += outcome.observation
    return sampled


def bench_rollout(recipe, sampler, repeats: int) -> dict:
    """Each repeat samples with a seed of its own, the same for both loops: a fixed seed
    would freeze one draw of sequence lengths (and of a batch's longest, which sets its
    decode steps) into every repeat. The ratio is the median of the per-seed ratios."""
    held_out = arithmetic_tasks("test")

    def ours(seed: int) -> int:
        params = SamplingParams(**{**PARAMS.to_dict(), "seed": seed})
        rollout = recipe.build_rollout(sampler, params)
        return sum(t.num_sampled_tokens for t in rollout(held_out, num_samples=4))

    def theirs(seed: int) -> int:
        return hand_written_rollout(sampler, held_out, 4, max_turns=3, seed=seed)

    ours(PARAMS.seed), theirs(PARAMS.seed)  # warm-up
    names = ("MultiTurnRollout", "hand-written")
    rates: dict[str, list[float]] = {name: [] for name in names}
    counts: dict[str, list[int]] = {name: [] for name in names}
    cpu_rates: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        order = (("MultiTurnRollout", ours), ("hand-written", theirs))
        for name, fn in order if repeat % 2 == 0 else order[::-1]:
            start, cpu_start = time.perf_counter(), time.process_time()
            tokens = fn(PARAMS.seed + 1 + repeat)
            counts[name].append(tokens)
            rates[name].append(tokens / (time.perf_counter() - start))
            cpu_rates[name].append(tokens / (time.process_time() - cpu_start))

    def paired(values: dict[str, list[float]]) -> float:
        pairs = zip(values["MultiTurnRollout"], values["hand-written"], strict=True)
        return statistics.median(mine / other for mine, other in pairs)

    return {
        **{name: statistics.median(values) for name, values in rates.items()},
        "ratio": paired(rates),
        # tokens per CPU second of this process: less swayed by a loaded machine
        "cpu": {name: statistics.median(values) for name, values in cpu_rates.items()},
        "cpu_ratio": paired(cpu_rates),
        "sampled_tokens": {name: statistics.median(values) for name, values in counts.items()},
        "per_repeat": {"tokens/s": rates, "sampled_tokens": counts},
    }


@dataclass(frozen=True)
class Config:
    """One GRPO run from a seed's warm start."""

    loss: str
    staleness: int
    updates: int
    lr: float

    @property
    def name(self) -> str:
        loss = "GRPO" if self.loss == "GRPOLoss" else "Decoupled"
        mode = "sync" if self.staleness == 0 else f"k={self.staleness}"
        return f"{loss} {mode} x{self.updates} lr {self.lr:g}"


def configs_for(parts: set[str], args) -> list[Config]:
    """The async part's k = 0, 1, 2 (GRPOLoss, one update per batch, the first
    ``--grpo-lr``), and the decoupled part's GRPOLoss against DecoupledPPOLoss at
    ``--decoupled-staleness`` for each ``--grpo-lr`` and ``--updates-per-batch``; a run both
    parts need runs once."""
    configs = []
    if "async" in parts:
        configs += [Config("GRPOLoss", k, 1, args.grpo_lr[0]) for k in (0, 1, 2)]
    if "decoupled" in parts:
        k = args.decoupled_staleness
        for lr in args.grpo_lr:
            for updates in args.updates_per_batch:
                configs += [
                    Config(loss, k, updates, lr) for loss in ("GRPOLoss", "DecoupledPPOLoss")
                ]
    return list(dict.fromkeys(configs))


def bench_seeds(recipe, args, configs: list[Config]) -> dict:
    """Per seed: one warm start (``--sft-steps``), then every config from its weights, the
    order rotated per seed so no config always runs first under the same load."""
    train, held_out = arithmetic_tasks("train"), arithmetic_tasks("test")
    results, model = {}, None
    for seed in args.seeds:
        warm_args = recipe.parse_args(["--sft-steps", str(args.sft_steps), "--seed", str(seed)])
        model = recipe.warm_start(warm_args, random.Random(seed), train)
        warm = {k: v.detach().clone() for k, v in model.model.state_dict().items()}
        turn = seed % len(configs)
        order = configs[turn:] + configs[:turn]
        runs = {}
        for config in order:
            model.model.load_state_dict(warm)
            run_args = recipe.parse_args(
                [
                    "--grpo-steps", str(args.grpo_steps), "--eval-every", str(args.eval_every),
                    "--max-staleness", str(config.staleness), "--loss", config.loss,
                    "--updates-per-batch", str(config.updates), "--seed", str(seed),
                    "--grpo-lr", str(config.lr),
                ]
            )  # fmt: skip
            load = os.getloadavg()[0]
            run = recipe.run_grpo(model, run_args, random.Random(1000 + seed), train, held_out)
            runs[config] = {**run, "load": (load + os.getloadavg()[0]) / 2}
            print(f"seed {seed}, {config.name}: {summary_line(run)}", flush=True)
        sync = runs.get(Config("GRPOLoss", 0, 1, args.grpo_lr[0]))
        target = None
        if sync is not None:  # half of the synchronous run's gain, a level each run can reach
            target = sync["before"] + 0.5 * max(sync["after"] - sync["before"], 0.0)
        for run in runs.values():
            reached = [c for c in run["curve"][1:] if target is not None and c[1] >= target]
            run["to_target"] = reached[0] if reached else None  # (seconds, success, steps)
            run["target"] = target
        results[seed] = {config: runs[config] for config in configs}
        model.model.load_state_dict(warm)
    return {"runs": results, "model": model}


def summary_line(run: dict) -> str:
    curve = " ".join(f"{success:.3f}" for _, success, _ in run["curve"])
    return (
        f"held-out {curve}; GRPO {run['grpo_seconds']:.0f} s, idle "
        f"{run['trainer_idle_fraction']:.0%}, ratio "
        f"{min(r[0] for r in run['ratio_range']):.2f}-{max(r[1] for r in run['ratio_range']):.2f}"
    )


def runs_to_json(runs: dict) -> list:
    return [
        {"seed": seed, "config": vars(config), "run": run}
        for seed, by_config in runs.items()
        for config, run in by_config.items()
    ]


def merge_runs(paths: list[Path]) -> tuple[dict, list[Config]]:
    """The runs of several ``--json`` files (say one per seed, run side by side)."""
    runs: dict = {}
    for path in paths:
        for entry in json.loads(path.read_text()):
            runs.setdefault(entry["seed"], {})[Config(**entry["config"])] = entry["run"]
    configs = list(dict.fromkeys(c for by_config in runs.values() for c in by_config))
    return runs, configs


def print_runs(runs: dict, configs: list[Config], args) -> None:
    """Per-seed rows, then the medians over seeds of each config."""
    print(
        f"| run ({args.grpo_steps} steps) | seed | held-out success by "
        "evaluation | GRPO s (load) | steps (s) to target | trainer idle | clipped at 1st "
        "update, mean | ratio to the sampler, min-max | is weight mean, max |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for config in configs:
        for seed, by_config in runs.items():
            run = by_config[config]
            curve = " -> ".join(f"{success:.3f}" for _, success, _ in run["curve"])
            hit = run["to_target"]
            reached = "-" if run["target"] is None else (
                "not reached" if hit is None else f"{hit[2]} ({hit[0]:.0f})"
            )  # fmt: skip
            low = min(r[0] for r in run["ratio_range"])
            high = max(r[1] for r in run["ratio_range"])
            weights = run["is_weights"]
            shown = "-" if not weights else (
                f"{statistics.mean(w[0] for w in weights):.3f}, {max(w[1] for w in weights):.2f}"
            )  # fmt: skip
            print(
                f"| {config.name} | {seed} | {curve} | {run['grpo_seconds']:.0f} "
                f"({run['load']:.0f}) | {reached} | {run['trainer_idle_fraction']:.0%} | "
                f"{statistics.mean(run['clip_fraction']):.3f} | {low:.2f}-{high:.2f} | {shown} |"
            )
    print(
        "\n| run | median before | median final (per seed) | median best | median idle "
        "| steps to target (per seed) |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for config in configs:
        seeds = [by_config[config] for by_config in runs.values()]
        finals = ", ".join(f"{run['after']:.3f}" for run in seeds)
        steps = ", ".join(
            "-" if run["to_target"] is None else str(run["to_target"][2]) for run in seeds
        )
        best = statistics.median(max(c[1] for c in run["curve"][1:]) for run in seeds)
        print(
            f"| {config.name} | {statistics.median(run['before'] for run in seeds):.3f} | "
            f"{statistics.median(run['after'] for run in seeds):.3f} ({finals}) | {best:.3f} | "
            f"{statistics.median(run['trainer_idle_fraction'] for run in seeds):.0%} | "
            f"{steps} |"
        )


def int_list(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item]


def float_list(text: str) -> list[float]:
    return [float(item) for item in text.split(",") if item]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--grpo-steps", type=int, default=12)
    parser.add_argument("--grpo-lr", type=float_list, default=[1e-3], help="e.g. 1e-3,3e-4")
    parser.add_argument("--eval-every", type=int, default=3)
    parser.add_argument("--seeds", type=int_list, default=[0], help="comma-separated, e.g. 0,1,2")
    parser.add_argument(
        "--updates-per-batch", type=int_list, default=[1], help="decoupled part, e.g. 1,4"
    )
    parser.add_argument(
        "--parts", default="rollout,async", help="rollout, async, decoupled (comma-separated)"
    )
    parser.add_argument("--decoupled-staleness", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the GRPO runs' figures there")
    parser.add_argument(
        "--merge", type=Path, nargs="+", help="print the tables of --json files (seeds run apart)"
    )
    args, _ = parser.parse_known_args()  # bench-rl passes its arguments to every script
    parts = set(args.parts.split(","))
    if not parts or parts - {"rollout", "async", "decoupled"}:
        parser.error(f"--parts takes rollout, async and decoupled, got {args.parts!r}")
    if not args.seeds or not args.updates_per_batch or min(args.updates_per_batch) < 1:
        parser.error("--seeds needs a seed and --updates-per-batch counts >= 1, e.g. 0,1,2 and 1,4")
    if args.merge:
        print_runs(*merge_runs(args.merge), args)
        return
    recipe = load_recipe()
    print(
        f"\n## Agentic RL ({datetime.date.today()}, {socket.gethostname()}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"commit {commit()}, seeds {args.seeds})\n",
        flush=True,
    )
    configs = configs_for(parts, args)
    model = None
    if configs:
        result = bench_seeds(recipe, args, configs)
        model = result["model"]
        print()
        print_runs(result["runs"], configs, args)
        if args.json:
            args.json.write_text(json.dumps(runs_to_json(result["runs"]), default=str))
    if "rollout" not in parts:
        return
    if model is None:  # the same warm start as the GRPO parts' first seed
        base = recipe.parse_args(["--sft-steps", str(args.sft_steps)])
        model = recipe.warm_start(base, random.Random(args.seeds[0]), arithmetic_tasks("train"))
    sampler = TorchSampler(model_id="bundled://tiny-qwen3")
    sampler.set_template("Qwen3_5Template")
    CheckpointEngineManager(model=model, sampler=sampler).sync_weights()
    rollout = bench_rollout(recipe, sampler, args.repeats)
    print(
        "\n| rollout (warm-started tiny model, 24 tasks x 4, <= 3 turns) | sampled tokens/s | "
        "per CPU second |"
    )
    print("| --- | --- | --- |")
    for name in ("MultiTurnRollout", "hand-written"):
        print(f"| {name} | {rollout[name]:.0f} | {rollout['cpu'][name]:.0f} |")
    print(f"| ratio | {rollout['ratio']:.2f}x | {rollout['cpu_ratio']:.2f}x |")
    print("\n" + json.dumps({"rollout": rollout}))


if __name__ == "__main__":
    main()
