"""Agentic RL: MultiTurnRollout's throughput against a hand-written loop, and asynchronous
GRPO (max_staleness 1, 2) against synchronous on the bundled calculator task.

1. **Rollout**: the same warm-started tiny model and TorchSampler, the held-out tasks x 4
   trajectories, up to 3 turns of up to 64 tokens. ``MultiTurnRollout`` (token in, token
   out: appends the sampled tokens and the rendered observation) against the loop a user
   writes without it: keep the messages, let the sampler encode the whole conversation each
   turn (``sampler.sample(trajectories)``), parse with ``template.parse_response``, step
   the envs. Sampled tokens per second, medians of ``--repeats`` alternating runs.
   Target: ratio >= 1.0x.
2. **Async**: one SFT warm start (``--sft-steps``), then ``--grpo-steps`` GRPO steps from
   the same weights for max_staleness 0 (synchronous), 1 and 2, held-out success measured
   every ``--eval-every`` steps (evaluation time excluded). Reported: GRPO wall seconds,
   seconds to the target success (half of the synchronous run's gain over the warm
   start; "not reached" when a run stays below it), the
   trainer's idle fraction (waiting for a batch or for the sampler to finish one before a
   sync), and the largest staleness trained on.

    .venv/bin/python benchmarks/bench_agentic.py [--repeats 3] [--sft-steps 600]
    .venv/bin/python benchmarks/bench_agentic.py --parts rollout --repeats 5   # 1. only
    .venv/bin/python benchmarks/bench_agentic.py --parts decoupled   # 3. only

3. **Decoupled** (alone): GRPOLoss against DecoupledPPOLoss from one warm start, both at
   max_staleness ``--decoupled-staleness`` (2), with held-out success every
   ``--eval-every`` steps, the range of ratios to the sampler and the importance weights.

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


def turn_seed(turn: int) -> int:
    """The seed MultiTurnRollout gives a turn's (first) sampler call, so both loops sample
    the same tokens wherever the re-encoded conversation is the appended token list."""
    words = np.random.SeedSequence([PARAMS.seed, turn, 0])
    return int(words.generate_state(1, np.uint64)[0] >> np.uint64(2))


def hand_written_rollout(sampler, tasks, num_samples: int, max_turns: int) -> int:
    """The loop without MultiTurnRollout; returns the sampled tokens it generated."""
    envs = EnvPool(ArithmeticToolEnv, describe_tools=False, max_workers=1)
    runs = [task for task in tasks for _ in range(num_samples)]
    conversations = {i: list(e.observation) for i, e in enumerate(envs.reset(runs))}
    sampled = 0
    for turn in range(max_turns):
        if not conversations:
            break
        live = list(conversations)
        params = SamplingParams(**{**PARAMS.to_dict(), "seed": turn_seed(turn)})
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
    held_out = arithmetic_tasks("test")
    rollout = recipe.build_rollout(sampler, PARAMS)

    def ours() -> int:
        return sum(t.num_sampled_tokens for t in rollout(held_out, num_samples=4))

    def theirs() -> int:
        return hand_written_rollout(sampler, held_out, 4, max_turns=3)

    ours(), theirs()  # warm-up
    names = ("MultiTurnRollout", "hand-written")
    rates: dict[str, list[float]] = {name: [] for name in names}
    counts: dict[str, list[int]] = {name: [] for name in names}
    cpu_rates: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(repeats):
        for name, fn in (("MultiTurnRollout", ours), ("hand-written", theirs)):
            start, cpu_start = time.perf_counter(), time.process_time()
            tokens = fn()
            counts[name].append(tokens)
            rates[name].append(tokens / (time.perf_counter() - start))
            cpu_rates[name].append(tokens / (time.process_time() - cpu_start))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    cpu = {name: statistics.median(values) for name, values in cpu_rates.items()}
    return {
        **medians,
        "ratio": medians["MultiTurnRollout"] / medians["hand-written"],
        "cpu": cpu,  # tokens per CPU second of this process: less swayed by a loaded machine
        "cpu_ratio": cpu["MultiTurnRollout"] / cpu["hand-written"],
        "sampled_tokens": {name: statistics.median(values) for name, values in counts.items()},
    }


def bench_async(recipe, args) -> dict:
    rng = random.Random(0)
    train, held_out = arithmetic_tasks("train"), arithmetic_tasks("test")
    base = recipe.parse_args(["--sft-steps", str(args.sft_steps)])
    model = recipe.warm_start(base, rng, train)
    warm = {k: v.detach().clone() for k, v in model.model.state_dict().items()}
    runs = {}
    for k in (0, 1, 2):
        model.model.load_state_dict(warm)
        run_args = recipe.parse_args(
            [
                "--grpo-steps", str(args.grpo_steps),
                "--eval-every", str(args.eval_every),
                "--max-staleness", str(k),
            ]
        )  # fmt: skip
        runs[k] = recipe.run_grpo(model, run_args, random.Random(1), train, held_out)
    # Half of the synchronous run's gain: a level each run can reach inside its steps.
    sync = runs[0]
    target = sync["before"] + 0.5 * max(sync["after"] - sync["before"], 0.0)
    for run in runs.values():
        reached = [s for s, success in run["curve"][1:] if success >= target]
        run["seconds_to_target"] = reached[0] if reached else None
    model.model.load_state_dict(warm)
    return {"target": target, "runs": runs, "warm_state": warm, "model": model}


def bench_decoupled(recipe, args) -> dict:
    """GRPOLoss against DecoupledPPOLoss at the largest staleness, from one warm start."""
    rng = random.Random(0)
    train, held_out = arithmetic_tasks("train"), arithmetic_tasks("test")
    model = recipe.warm_start(recipe.parse_args(["--sft-steps", str(args.sft_steps)]), rng, train)
    warm = {k: v.detach().clone() for k, v in model.model.state_dict().items()}
    runs = {}
    for loss in ("GRPOLoss", "DecoupledPPOLoss"):
        model.model.load_state_dict(warm)
        run_args = recipe.parse_args(
            [
                "--grpo-steps", str(args.grpo_steps), "--eval-every", str(args.eval_every),
                "--max-staleness", str(args.decoupled_staleness), "--loss", loss,
            ]
        )  # fmt: skip
        runs[loss] = recipe.run_grpo(model, run_args, random.Random(1), train, held_out)
    return runs


def print_decoupled(runs: dict, args) -> None:
    k = args.decoupled_staleness
    print(
        f"| loss, k = {k}, {args.grpo_steps} steps | held-out success by evaluation | GRPO s | "
        f"ratio to the sampler, min-max over steps | is weight mean, max over steps |"
    )
    print("| --- | --- | --- | --- | --- |")
    for loss, run in runs.items():
        curve = " -> ".join(f"{success:.3f}" for _, success in run["curve"])
        low = min(r[0] for r in run["ratio_range"])
        high = max(r[1] for r in run["ratio_range"])
        weights = run["is_weights"]
        shown = "-" if not weights else (
            f"{min(w[0] for w in weights):.3f}-{max(w[0] for w in weights):.3f}, "
            f"{max(w[1] for w in weights):.2f}"
        )  # fmt: skip
        print(f"| {loss} | {curve} | {run['grpo_seconds']:.0f} | {low:.2f}-{high:.2f} | {shown} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--grpo-steps", type=int, default=12)
    parser.add_argument("--eval-every", type=int, default=3)
    parser.add_argument(
        "--parts", default="rollout,async", help="rollout, async, decoupled (comma-separated)"
    )
    parser.add_argument("--decoupled-staleness", type=int, default=2)
    args, _ = parser.parse_known_args()  # bench-rl passes its arguments to every script
    parts = set(args.parts.split(","))
    if not parts or parts - {"rollout", "async", "decoupled"}:
        parser.error(f"--parts takes rollout, async and decoupled, got {args.parts!r}")
    recipe = load_recipe()
    if parts == {"decoupled"}:  # GRPOLoss against DecoupledPPOLoss on stale batches only
        print(f"\n## Agentic RL, decoupled PPO ({datetime.date.today()}, commit {commit()})\n")
        print_decoupled(bench_decoupled(recipe, args), args)
        return

    if "async" in parts:
        result = bench_async(recipe, args)
        model = result["model"]
    else:  # the same warm start as the async part's, without its GRPO runs
        base = recipe.parse_args(["--sft-steps", str(args.sft_steps)])
        model = recipe.warm_start(base, random.Random(0), arithmetic_tasks("train"))
    sampler = TorchSampler(model_id="bundled://tiny-qwen3")
    sampler.set_template("Qwen3_5Template")
    CheckpointEngineManager(model=model, sampler=sampler).sync_weights()
    rollout = bench_rollout(recipe, sampler, args.repeats)

    print(
        f"\n## Agentic RL ({datetime.date.today()}, {socket.gethostname()}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"commit {commit()})\n"
    )
    print(
        "| rollout (warm-started tiny model, 24 tasks x 4, <= 3 turns) | sampled tokens/s | "
        "per CPU second |"
    )
    print("| --- | --- | --- |")
    for name in ("MultiTurnRollout", "hand-written"):
        print(f"| {name} | {rollout[name]:.0f} | {rollout['cpu'][name]:.0f} |")
    print(f"| ratio | {rollout['ratio']:.2f}x | {rollout['cpu_ratio']:.2f}x |\n")
    if "async" not in parts:
        print("\n" + json.dumps({"rollout": rollout}))
        return
    print(
        f"| GRPO, {args.grpo_steps} steps | held-out success before -> after | GRPO s | "
        f"s to {result['target']:.3f} | ratio to sync | trainer idle | max staleness |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    sync_time = result["runs"][0]["seconds_to_target"]
    for k, run in result["runs"].items():
        name = "sync (k = 0)" if k == 0 else f"async k = {k}"
        to_target = run["seconds_to_target"]
        reached = "not reached" if to_target is None else f"{to_target:.0f}"
        ratio = "-" if to_target is None or not sync_time else f"{to_target / sync_time:.2f}x"
        print(
            f"| {name} | {run['before']:.3f} -> {run['after']:.3f} | {run['grpo_seconds']:.0f} | "
            f"{reached} | {ratio} | {run['trainer_idle_fraction']:.0%} | "
            f"{max(run['staleness'])} |"
        )
    summary = {
        k: {n: v for n, v in run.items() if n != "curve"} for k, run in result["runs"].items()
    }
    print("\n" + json.dumps({"rollout": rollout, "async": summary}, default=str))


if __name__ == "__main__":
    main()
