r"""GRPO that visibly learns, on a CPU in a few minutes: a short SFT warm start, then GRPO.

    python cookbook/rl/grpo_arithmetic.py            # about 30 s on 2 quiet CPU cores
    python cookbook/rl/grpo_arithmetic.py --sft-steps 150 --grpo-steps 15   # the test's run

The task, defined here: "What is a + b?" for single digits a and b. The 100 pairs are split
(seeded) into 80 for training and 20 held out. The warm start teaches the bundled tiny model
(random init, 2 layers, hidden 64) to answer in one of three styles picked at random per
row: ``#### 7``, ``The answer is 7.`` or a bare ``7``. Only the first is what
GSM8KFormatReward and GSM8KAccuracyReward accept, so after SFT about a third of the samples
score. GRPO then samples 8 completions per prompt with TorchSampler, rewards them with
format + accuracy (the documents' GSM8K rewards), and trains with GRPOLoss on group-relative
advantages, syncing the weights to the sampler after each step.

Honest about what it shows: RL here mostly selects a behaviour the warm start already has
(the rewarded answer style), as RL on a pretrained model does; how much the sums
themselves improve depends on how many of them SFT taught. The held-out reward is the mean
of format + accuracy (0 to 2) over 4 samples per held-out prompt at temperature 1 with a
fixed seed, measured before and after GRPO. The answers have no reasoning, so every
template has ``enable_thinking=False``: Qwen3's generation prompt then holds the empty
think block and the model writes, and is trained on, the answer alone. Seeds: data split
and SFT rows from ``--seed`` (0), model init seed 0, evaluation sampling seed 1234.
Measured with the defaults (2026-11-29, CPU, before Qwen3's own format): 0.475 after SFT
-> 1.363 after GRPO (format 0.34 -> 0.99, accuracy 0.14 -> 0.38), 28 s in all.
"""

from __future__ import annotations

import argparse
import random
import time

from twinkle import get_logger
from twinkle.advantage import GRPOAdvantage
from twinkle.checkpoint_engine import CheckpointEngineManager
from twinkle.data_format import SamplingParams
from twinkle.metric import CompletionRewardMetric
from twinkle.model import TransformersModel
from twinkle.reward import GSM8KAccuracyReward, GSM8KFormatReward
from twinkle.sampler import TorchSampler

logger = get_logger()
STYLES = ("#### {answer}", "The answer is {answer}.", "{answer}")
EVAL_SEED = 1234


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model-id", default="bundled://tiny-qwen3")
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--grpo-steps", type=int, default=60)
    parser.add_argument("--grpo-lr", type=float, default=1e-3)
    parser.add_argument("--prompts-per-step", type=int, default=8)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def prompt(a: int, b: int) -> dict:
    """An RL prompt whose ground truth the GSM8K rewards read from user_data."""
    return {
        "messages": [{"role": "user", "content": f"What is {a} + {b}?"}],
        "user_data": [{"answer": str(a + b)}],
    }


def sft_row(a: int, b: int, rng: random.Random) -> dict:
    reply = rng.choice(STYLES).format(answer=a + b)
    return {"messages": [*prompt(a, b)["messages"], {"role": "assistant", "content": reply}]}


def rewards_of(features: list) -> tuple[list[float], list[float], list[float]]:
    accuracy = GSM8KAccuracyReward()(features)
    form = GSM8KFormatReward()(features)
    return [a + f for a, f in zip(accuracy, form, strict=True)], form, accuracy


def held_out_reward(sampler: TorchSampler, pairs: list[tuple[int, int]]) -> dict[str, float]:
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=EVAL_SEED)
    responses = sampler.sample([prompt(a, b) for a, b in pairs], params, num_samples=4)
    total, form, accuracy = rewards_of(
        [s.new_input_feature for r in responses for s in r.sequences]
    )
    n = len(total)
    return {"reward": sum(total) / n, "format": sum(form) / n, "accuracy": sum(accuracy) / n}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    pairs = [(a, b) for a in range(10) for b in range(10)]
    rng.shuffle(pairs)
    held_out, train = pairs[:20], pairs[20:]
    start = time.perf_counter()

    # 1. SFT warm start: every parameter, since the tiny model starts from random weights.
    model = TransformersModel(model_id=args.model_id)
    model.set_template("Qwen3_5Template", enable_thinking=False)
    model.set_optimizer("AdamW", lr=args.sft_lr)
    for step in range(args.sft_steps):
        batch = [sft_row(*rng.choice(train), rng) for _ in range(16)]
        output = model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
        if step % 100 == 0:
            logger.info(f"sft step {step}: loss {output.loss:.3f}")

    sampler = TorchSampler(model_id=args.model_id, seed=args.seed)
    sampler.set_template("Qwen3_5Template", enable_thinking=False)
    ckpt_manager = CheckpointEngineManager(model=model, sampler=sampler)
    ckpt_manager.sync_weights(merge_and_sync=True)
    before = held_out_reward(sampler, held_out)
    logger.info(f"held-out after SFT: {before} ({time.perf_counter() - start:.0f} s)")

    # 2. GRPO: sample a group per prompt, reward, advantages, one policy-gradient step, sync.
    model.set_loss("GRPOLoss", epsilon=0.2)
    model.set_optimizer("AdamW", lr=args.grpo_lr)
    advantage_fn = GRPOAdvantage()
    metrics = CompletionRewardMetric()
    sampling_params = SamplingParams(max_tokens=args.max_new_tokens, temperature=1.0)
    for step in range(args.grpo_steps):
        prompts = [prompt(*rng.choice(train)) for _ in range(args.prompts_per_step)]
        responses = sampler.sample(prompts, sampling_params, num_samples=args.num_generations)
        sequences = [seq for response in responses for seq in response.sequences]
        features = [seq.new_input_feature for seq in sequences]
        old_logps = [[pairs[0][1] for pairs in seq.logprobs] for seq in sequences]
        total, form, accuracy = rewards_of(features)
        metrics.accumulate(
            completion_lengths=[len(seq.tokens) for seq in sequences],
            rewards={"total": total, "format": form, "accuracy": accuracy},
        )
        advantages = advantage_fn(total, num_generations=args.num_generations, scale="group")
        model.forward_backward(inputs=features, old_logps=old_logps, advantages=advantages.tolist())
        model.clip_grad_and_step()
        ckpt_manager.sync_weights(merge_and_sync=True)
        if step % 10 == 0 or step == args.grpo_steps - 1:
            log = {**metrics.calculate(), **model.calculate_metric(is_training=True)}
            metrics.reset()
            shown = {k: round(v, 4) for k, v in log.items() if k.startswith(("reward", "policy"))}
            logger.info(f"grpo step {step}: {shown}")

    after = held_out_reward(sampler, held_out)
    logger.info(f"held-out after GRPO: {after} ({time.perf_counter() - start:.0f} s)")
    print(f"held-out reward: {before['reward']:.3f} after SFT -> {after['reward']:.3f} after GRPO")
    return {"before": before, "after": after}


if __name__ == "__main__":
    main()
