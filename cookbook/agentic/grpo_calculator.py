r"""Agentic GRPO on CPU: a tiny model learns to use a calculator tool over several turns.

    python cookbook/agentic/grpo_calculator.py                      # synchronous
    python cookbook/agentic/grpo_calculator.py --max-staleness 1    # the same run, async
    python cookbook/agentic/grpo_calculator.py --max-staleness 1 --loss DecoupledPPOLoss
    python cookbook/agentic/grpo_calculator.py --max-staleness 2 --updates-per-batch 4
    python cookbook/agentic/grpo_calculator.py --backend megatron   # MegatronModel trains

The task is twinkle.env's bundled one: "7 * 12 = ?" for operands 2..12, with a
``calculator`` tool; 97 products to train on, 24 held out. A turn that calls the tool gets
its result as an observation; a turn without a call is the answer, rewarded 1 when it is
the product. The bundled tiny model (random init, 2 layers, hidden 64) cannot multiply, so
on held-out products it succeeds only through the tool.

1. SFT warm start, all parameters: 70% of the rows call the tool and copy its result, the
   rest answer at once with a wrong product. After it the model does either.
2. GRPO: each step runs ``--tasks-per-step`` tasks x ``--num-generations`` trajectories with
   ``MultiTurnRollout`` (TorchSampler; the sequence is the sampled tokens plus the template's
   rendering of each tool result, only the model's tokens train), group-relative advantages
   of the env's rewards, GRPOLoss with the sampler's logprobs as old_logps, weight sync.
   Rollouts come from ``AsyncRollouts``: ``--max-staleness 0`` (the default) is the
   synchronous loop; ``k > 0`` samples the next batches while the trainer trains, on
   weights at most k steps old (GRPOLoss's ratio against the sampler's logprobs is the
   importance correction; PolicyMetric reports it). ``--loss DecoupledPPOLoss`` keeps the
   stale sampler (the behaviour policy, ``old_logps``) apart from the trainer's weights
   before the update (the proximal policy, ``model.policy_logps``): the clip is centred on
   the trainer's policy and the staleness is corrected by a truncated importance weight
   (``policy/is_weight_mean``, ``is_truncated_fraction``). ``--updates-per-batch n`` takes
   n optimizer steps on each batch (PPO epochs) before the weights sync; the proximal
   logps are taken once, before the first, so the later steps are clipped against the
   policy the batch started from.

Honest about what it shows: RL mostly selects a behaviour the warm start has (calling the
tool), and sharpens the copying the tool loop needs; held-out success is the mean reward of
``--eval-samples`` trajectories per held-out task at temperature 1 with a fixed seed,
before and after GRPO.
On a 2-core CPU the async producer is a thread that shares the cores with the trainer, so
the overlap is small here; it pays where the sampler runs elsewhere (Ray, a server, a GPU).
Measured with the defaults (2026-12-02, loaded 2-core CPU, seed 0): held-out success 0.448
after SFT -> 0.573 after 20 synchronous GRPO steps, 623 s in all. Asynchronous runs reach
less per step on this tiny model (benchmarks/RESULTS.md: k = 1 0.510, k = 2 0.448 after 12
steps, against 0.573 synchronous): one Adam step moves it far, so stale ratios spread wide.
"""

from __future__ import annotations

import argparse
import random
import time

from twinkle import get_logger
from twinkle.advantage import GRPOAdvantage
from twinkle.checkpoint_engine import CheckpointEngineManager
from twinkle.data_format import SamplingParams, ToolCall
from twinkle.env import ArithmeticToolEnv, EnvPool, arithmetic_tasks
from twinkle.env.arithmetic import OPERANDS
from twinkle.model import MegatronModel, TransformersModel
from twinkle.rollout import AsyncRollouts, MultiTurnRollout
from twinkle.sampler import TorchSampler

logger = get_logger()
EVAL_SEED = 1234
TOOL_ROWS = 0.7


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model-id", default="bundled://tiny-qwen3")
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--grpo-steps", type=int, default=20)
    parser.add_argument("--grpo-lr", type=float, default=1e-3)
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-staleness", type=int, default=0)
    parser.add_argument(
        "--updates-per-batch",
        type=int,
        default=1,
        help="optimizer steps on each rollout batch (PPO epochs); the weights sync after the last",
    )
    parser.add_argument("--loss", choices=("GRPOLoss", "DecoupledPPOLoss"), default="GRPOLoss")
    parser.add_argument("--turn-tokens", type=int, default=64, help="a tool call takes ~50")
    parser.add_argument("--eval-samples", type=int, default=4, help="per held-out task")
    parser.add_argument("--eval-every", type=int, default=0, help="0: before and after only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--backend",
        choices=("transformers", "megatron"),
        default="transformers",
        help="megatron: MegatronModel (its CPU mode without a GPU), synced through a folder",
    )
    args = parser.parse_args(argv)
    if args.updates_per_batch < 1:
        parser.error(f"--updates-per-batch must be >= 1, got {args.updates_per_batch}")
    return args


def sft_row(task: dict, rng: random.Random) -> dict:
    """A solved episode (call, result, answer) or, 30% of the time, a wrong direct answer."""
    data = task["user_data"][0]
    if rng.random() < TOOL_ROWS:
        call = ToolCall(name="calculator", arguments={"expression": data["expression"]})
        turns = [
            {"role": "assistant", "content": "", "tool_calls": [call.to_openai()]},
            {"role": "tool", "content": data["answer"]},
            {"role": "assistant", "content": data["answer"]},
        ]
    else:
        wrong = rng.choice(
            [a * b for a in OPERANDS for b in OPERANDS if a * b != int(data["answer"])]
        )
        turns = [{"role": "assistant", "content": str(wrong)}]
    return {"messages": [*task["messages"], *turns]}


def build_rollout(sampler: TorchSampler, params: SamplingParams) -> MultiTurnRollout:
    envs = EnvPool(ArithmeticToolEnv, describe_tools=False, max_workers=1)
    return MultiTurnRollout(sampler, sampler.template, envs, max_turns=3, sampling_params=params)


def held_out_success(sampler: TorchSampler, tasks: list[dict], args: argparse.Namespace) -> float:
    params = SamplingParams(max_tokens=args.turn_tokens, temperature=1.0, seed=EVAL_SEED)
    trajectories = build_rollout(sampler, params)(tasks, num_samples=args.eval_samples)
    return sum(t.reward for t in trajectories) / len(trajectories)


def warm_start(
    args: argparse.Namespace, rng: random.Random, train: list[dict]
) -> TransformersModel | MegatronModel:
    """SFT on solved and guessed episodes, every parameter (the tiny model starts random)."""
    if args.backend == "megatron":
        model = MegatronModel(model_id=args.model_id)
    else:
        model = TransformersModel(model_id=args.model_id)
    model.set_template("Qwen3_5Template")
    model.set_optimizer("AdamW", lr=args.sft_lr)
    for step in range(args.sft_steps):
        output = model.forward_backward(inputs=[sft_row(rng.choice(train), rng) for _ in range(16)])
        model.clip_grad_and_step()
        if step % 100 == 0:
            logger.info(f"sft step {step}: loss {output.loss:.3f}")
    return model


def run_grpo(
    model: TransformersModel | MegatronModel,
    args: argparse.Namespace,
    rng: random.Random,
    train: list[dict],
    held_out: list[dict],
) -> dict:
    """GRPO over multi-turn rollouts sampled ahead by at most ``max_staleness`` versions."""
    sampler = TorchSampler(model_id=args.model_id, seed=args.seed)
    sampler.set_template("Qwen3_5Template")
    # MegatronModel's weights reach the sampler through a folder of Hugging Face weights.
    transport = "folder" if args.backend == "megatron" else "broadcast"
    ckpt_manager = CheckpointEngineManager(model=model, sampler=sampler, transport=transport)
    ckpt_manager.sync_weights(merge_and_sync=True)
    before = held_out_success(sampler, held_out, args)
    logger.info(f"held-out success after SFT: {before:.3f}")

    decoupled = args.loss == "DecoupledPPOLoss"
    model.set_loss(args.loss, epsilon=0.2)
    model.set_optimizer("AdamW", lr=args.grpo_lr)
    advantage_fn = GRPOAdvantage()
    rollout = build_rollout(sampler, SamplingParams(max_tokens=args.turn_tokens, temperature=1.0))

    def produce(index: int) -> list:
        tasks = [rng.choice(train) for _ in range(args.tasks_per_step)]
        return rollout(tasks, num_samples=args.num_generations)

    def sync_weights() -> None:
        ckpt_manager.sync_weights(merge_and_sync=True)

    curve, eval_s, staleness, ratios, weights = [(0.0, before, 0)], 0.0, [], [], []
    clipped = []
    start = time.perf_counter()
    steps, k = args.grpo_steps, args.max_staleness
    with AsyncRollouts(produce, sync_weights, k, num_batches=steps) as rollouts:
        for step in range(steps):
            batch = rollouts.next_batch()
            trajectories = batch.data
            rewards = [t.reward for t in trajectories]
            advantages = advantage_fn(rewards, num_generations=args.num_generations, scale="group")
            features = [t.input_feature() for t in trajectories]
            # Decoupled PPO: the proximal policy is the trainer's before this batch's first
            # update, and stays so for its later ones (their trust region is centred on it).
            extra = {"prox_logps": model.policy_logps(features)} if decoupled else {}
            old_logps, per_row = [t.sampled_logprobs() for t in trajectories], advantages.tolist()
            low, high = float("inf"), 0.0
            for update in range(args.updates_per_batch):
                model.forward_backward(
                    inputs=features, old_logps=old_logps, advantages=per_row, **extra
                )
                model.clip_grad_and_step()
                metrics = model.calculate_metric(is_training=True)
                low = min(low, metrics["policy/ratio_min"])
                high = max(high, metrics["policy/ratio_max"])
                if update == 0:  # the tokens the loss clips (or truncates) before it moves
                    clipped.append(metrics["policy/clip_fraction"])
            rollouts.publish()
            staleness.append(batch.staleness)
            ratios.append((low, high))  # to the sampler, over the batch's updates
            if decoupled:
                weights.append((metrics["policy/is_weight_mean"], metrics["policy/is_weight_max"]))
            shown = {
                k: round(v, 3)
                for k, v in metrics.items()
                if k.startswith(("policy/ratio", "policy/is_"))
            }
            logger.info(
                f"grpo step {step}: reward {sum(rewards) / len(rewards):.3f}, staleness "
                f"{batch.staleness}, {shown}"
            )
            if args.eval_every and (step + 1) % args.eval_every == 0:
                with rollouts.sampler_paused():  # evaluation time is not training time
                    paused = time.perf_counter()
                    success = held_out_success(sampler, held_out, args)
                    eval_s += time.perf_counter() - paused
                curve.append((time.perf_counter() - start - eval_s, success, step + 1))
    grpo_s = time.perf_counter() - start - eval_s
    after = held_out_success(sampler, held_out, args)
    curve.append((grpo_s, after, steps))
    logger.info(f"held-out success after GRPO: {after:.3f} (curve {curve})")
    return {
        "before": before,
        "after": after,
        "grpo_seconds": grpo_s,
        "trainer_idle_fraction": rollouts.trainer_wait_s / max(grpo_s, 1e-9),
        "staleness": staleness,
        "ratio_range": ratios,
        "clip_fraction": clipped,  # per step, at its first update
        "is_weights": weights,  # DecoupledPPOLoss: (mean, max) per step
        "curve": curve,  # (GRPO seconds, held-out success, steps done)
        "dropped": rollouts.dropped,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    train, held_out = arithmetic_tasks("train", args.seed), arithmetic_tasks("test", args.seed)
    start = time.perf_counter()
    model = warm_start(args, rng, train)
    result = run_grpo(model, args, rng, train, held_out)
    print(
        f"held-out success: {result['before']:.3f} after SFT -> {result['after']:.3f} after GRPO; "
        f"GRPO {result['grpo_seconds']:.0f} s, trainer idle {result['trainer_idle_fraction']:.0%}, "
        f"max staleness {max(result['staleness'])}; {time.perf_counter() - start:.0f} s in all"
    )
    return result


if __name__ == "__main__":
    main()
