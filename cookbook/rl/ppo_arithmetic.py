r"""PPO with a critic that visibly learns, on a CPU: the GRPO recipe's task with a value
model and GAE in place of group-relative advantages.

    python cookbook/rl/ppo_arithmetic.py            # under a minute on 2 quiet CPU cores
    python cookbook/rl/ppo_arithmetic.py --sft-steps 150 --ppo-steps 15   # the test's run

The task and its rewards are ``grpo_arithmetic``'s ("What is a + b?", format + accuracy,
80 train / 20 held-out pairs, the same SFT warm start). After the warm start the policy
is saved and the critic, a ``TransformersValueModel``, is built from that checkpoint (its
backbone starts as the policy's, its value head fresh). Each PPO step samples one
completion per prompt, scores the label tokens with the critic, places the reward on each
completion's last token (``GAEAdvantage.build_token_rewards``), computes per-token
advantages and returns with GAE (gamma 1, lambda 0.95, whitened), and then, for
``--ppo-epochs`` passes over the rollout, trains the policy with ``PPOLoss`` (the sampler's
logprobs as ``old_logps``) and the critic with ``PPOValueLoss`` (its values before the
update as ``old_values``). The weights go to the sampler after each step.

Seeds: data split and SFT rows from ``--seed`` (0), model init seed 0, evaluation sampling
seed 1234 (``grpo_arithmetic.held_out_reward``). Measured figures are in the closing note
of issue 17 and benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import grpo_arithmetic as task  # noqa: E402  (the task lives beside this recipe)

from twinkle import get_logger  # noqa: E402
from twinkle.advantage import GAEAdvantage  # noqa: E402
from twinkle.checkpoint_engine import CheckpointEngineManager  # noqa: E402
from twinkle.data_format import SamplingParams  # noqa: E402
from twinkle.metric import CompletionRewardMetric  # noqa: E402
from twinkle.model import TransformersModel, TransformersValueModel  # noqa: E402
from twinkle.sampler import TorchSampler  # noqa: E402

logger = get_logger()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model-id", default="bundled://tiny-qwen3")
    parser.add_argument("--sft-steps", type=int, default=600)
    parser.add_argument("--sft-lr", type=float, default=3e-3)
    parser.add_argument("--ppo-steps", type=int, default=40)
    parser.add_argument("--ppo-epochs", type=int, default=2)
    parser.add_argument("--policy-lr", type=float, default=1e-3)
    parser.add_argument("--critic-lr", type=float, default=3e-3)
    parser.add_argument("--prompts-per-step", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def label_positions(feature) -> list[int]:
    """The positions of a feature's label tokens (what values and logps are aligned to)."""
    labels = list(feature["labels"])
    return [t for t in range(1, len(labels)) if labels[t] != -100]


def per_token(grid: torch.Tensor, positions: list[list[int]]) -> list[list[float]]:
    """Each row's values at its label positions, as the per-sequence lists losses take."""
    return [grid[row, where].tolist() for row, where in enumerate(positions)]


def main(argv: list[str] | None = None) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:  # the warm start the critic is built from
        return run(parse_args(argv), folder)


def run(args: argparse.Namespace, folder: str) -> dict[str, object]:
    rng = random.Random(args.seed)
    pairs = [(a, b) for a in range(10) for b in range(10)]
    rng.shuffle(pairs)
    held_out, train = pairs[:20], pairs[20:]
    start = time.perf_counter()

    # 1. The SFT warm start of grpo_arithmetic, then the critic from the policy's weights.
    policy = TransformersModel(model_id=args.model_id)
    policy.set_template("Qwen3_5Template", enable_thinking=False)
    policy.set_optimizer("AdamW", lr=args.sft_lr)
    for _ in range(args.sft_steps):
        policy.forward_backward(inputs=[task.sft_row(*rng.choice(train), rng) for _ in range(16)])
        policy.clip_grad_and_step()
    warm = policy.save("sft", output_dir=folder, save_optimizer=False)
    critic = TransformersValueModel(model_id=warm)
    critic.set_template("Qwen3_5Template", enable_thinking=False)
    critic.set_optimizer("AdamW", lr=args.critic_lr)

    sampler = TorchSampler(model_id=args.model_id, seed=args.seed)
    sampler.set_template("Qwen3_5Template", enable_thinking=False)
    ckpt_manager = CheckpointEngineManager(model=policy, sampler=sampler)
    ckpt_manager.sync_weights(merge_and_sync=True)
    before = task.held_out_reward(sampler, held_out)
    logger.info(f"held-out after SFT: {before} ({time.perf_counter() - start:.0f} s)")

    # 2. PPO: sample, score with the critic, GAE, a few epochs of policy and critic updates.
    policy.set_loss("PPOLoss", epsilon=0.2)
    policy.set_optimizer("AdamW", lr=args.policy_lr)
    gae = GAEAdvantage(gamma=1.0, gae_lambda=0.95)
    metrics = CompletionRewardMetric()
    sampling_params = SamplingParams(max_tokens=args.max_new_tokens, temperature=1.0)
    curve, explained = [], []
    for step in range(args.ppo_steps):
        prompts = [task.prompt(*rng.choice(train)) for _ in range(args.prompts_per_step)]
        responses = sampler.sample(prompts, sampling_params, num_samples=1)
        sequences = [seq for response in responses for seq in response.sequences]
        features = [seq.new_input_feature for seq in sequences]
        old_logps = [[lp[0][1] for lp in seq.logprobs] for seq in sequences]
        total, form, accuracy = task.rewards_of(features)
        metrics.accumulate(
            completion_lengths=[len(seq.tokens) for seq in sequences],
            rewards={"total": total, "format": form, "accuracy": accuracy},
        )
        positions = [label_positions(f) for f in features]
        old_values = per_token(critic.forward_only(inputs=features)["values"], positions)
        token_rewards = GAEAdvantage.build_token_rewards(total, [len(p) for p in positions])
        advantages, returns = gae(token_rewards, old_values)
        lengths = [len(p) for p in positions]
        advantages = [advantages[row, :n].tolist() for row, n in enumerate(lengths)]
        returns = [returns[row, :n].tolist() for row, n in enumerate(lengths)]
        for _ in range(args.ppo_epochs):
            policy.forward_backward(inputs=features, old_logps=old_logps, advantages=advantages)
            policy.clip_grad_and_step()
            critic.forward_backward(inputs=features, returns=returns, old_values=old_values)
            critic.clip_grad_and_step()
        ckpt_manager.sync_weights(merge_and_sync=True)
        log = {**metrics.calculate(), **policy.calculate_metric(is_training=True)}
        log.update(critic.calculate_metric(is_training=True))
        metrics.reset()
        curve.append(round(log["reward/total/mean"], 3))
        explained.append(round(log.get("value/explained_variance", float("nan")), 3))
        if step % 10 == 0 or step == args.ppo_steps - 1:
            shown = {
                k: round(v, 3)
                for k, v in log.items()
                if k.startswith(("reward", "policy", "value"))
            }
            logger.info(f"ppo step {step}: {shown}")

    after = task.held_out_reward(sampler, held_out)
    logger.info(f"held-out after PPO: {after} ({time.perf_counter() - start:.0f} s)")
    print(f"held-out reward: {before['reward']:.3f} after SFT -> {after['reward']:.3f} after PPO")
    print(f"training reward per step: {curve}")
    return {
        "before": before,
        "after": after,
        "train_reward": curve,
        "explained_variance": explained,  # the critic's, per step, on each step's rollout
    }


if __name__ == "__main__":
    main()
