"""Remote GRPO with the Twinkle client: the documents' Countdown example, against a local server.

    twinkle-server launch -c cookbook/client/server/transformer/server_config.yaml &
    TWINKLE_SERVER_TOKEN=tml-... python cookbook/client/twinkle/grpo.py --max-steps 2

The loop is the documents': sample completions from the server's sampler with the newest
saved adapter (``adapter_uri``), score them here (rewards are client code), compute
group-relative advantages, and train with the server-side GRPOLoss. Only the ids differ
(bundled tiny model and Countdown data; the server samples with TorchSampler on a CPU).
The tiny model is a random init, so it does not solve Countdown: every reward is 0 and the
steps are skipped as the documents' loop skips zero-advantage groups. This shows the client
plumbing on a laptop; with a real model the same loop trains (``cookbook/rl/grpo_arithmetic.py``
is the local run that visibly learns).
"""

from __future__ import annotations

import argparse
import os
import re

from peft import LoraConfig

from twinkle import get_logger
from twinkle.advantage import GRPOAdvantage
from twinkle.data_format import Trajectory
from twinkle.metric import CompletionRewardMetric
from twinkle.reward import FormatReward
from twinkle.reward.base import Reward
from twinkle_client import init_twinkle_client
from twinkle_client.dataloader import DataLoader
from twinkle_client.dataset import Dataset, DatasetMeta
from twinkle_client.model import MultiLoraTransformersModel
from twinkle_client.sampler import vLLMSampler

logger = get_logger()

MODEL_ID = "bundled://tiny-qwen3"
NUM_GENERATIONS = 4
LEARNING_RATE = 1e-5
BATCH_SIZE = 2
TEMPERATURE = 1.0
SYNC_INTERVAL = 1  # save weights for the sampler every N steps
GRADIENT_ACCUMULATION_STEPS = 4


def create_countdown_dataset(rows: int) -> Dataset:
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://countdown", data_slice=range(rows)))
    dataset.set_template("Template", model_id=MODEL_ID, max_length=8192)
    dataset.map("CountdownProcessor")
    dataset.encode(add_generation_prompt=True, batched=True)
    return dataset


class CountDownAccuracy(Reward):
    @staticmethod
    def countdown_accuracy_reward(completion: str, target: int, nums: list[int]) -> float:
        """1 when the <answer> equation uses exactly ``nums`` and equals ``target``."""
        try:
            match = re.search(r"<answer>(.*?)<\/answer>", completion)
            if match is None:
                return 0.0
            equation = match.group(1).strip()
            if "=" in equation:
                equation = equation.split("=")[0]
            used_numbers = [int(n) for n in re.findall(r"\d+", equation)]
            if sorted(used_numbers) != sorted(nums):
                return 0.0
            if not re.match(r"^[\d+\-*/().\s]+$", equation):
                return 0.0
            result = eval(equation, {"__builtins__": None}, {})  # digits and operators only
            return 1.0 if abs(float(result) - float(target)) < 1e-5 else 0.0
        except Exception:  # noqa: BLE001 - any malformed equation scores 0
            return 0.0

    def __call__(self, trajectories: list[Trajectory], ground_truths=None) -> list[float]:
        rewards = []
        for trajectory in trajectories:
            completion = ""
            for msg in reversed(trajectory.get("messages", []) or []):
                if msg.get("role") == "assistant":
                    completion = msg.get("content", "")
                    break
            user_data = trajectory.get("user_data", [{}])
            data = user_data[0] if isinstance(user_data, list) and user_data else {}
            rewards.append(
                self.countdown_accuracy_reward(
                    completion, data.get("target", 0), data.get("nums", [])
                )
            )
        return rewards


def compute_rewards(trajectories) -> tuple[list[float], list[float], list[float]]:
    format_rewards = FormatReward()(trajectories, [])
    accuracy_rewards = CountDownAccuracy()(trajectories, [])
    total_rewards = [a + b for a, b in zip(accuracy_rewards, format_rewards, strict=True)]
    return total_rewards, format_rewards, accuracy_rewards


def train(base_url: str, max_steps: int, max_new_tokens: int) -> None:
    client = init_twinkle_client(base_url=base_url, api_key=os.environ.get("TWINKLE_SERVER_TOKEN"))
    dataloader = DataLoader(
        dataset=create_countdown_dataset(4 * BATCH_SIZE * max_steps), batch_size=BATCH_SIZE
    )

    model = MultiLoraTransformersModel(model_id=MODEL_ID)
    lora_config = LoraConfig(target_modules="all-linear", r=8, lora_alpha=32, lora_dropout=0.05)
    model.add_adapter_to_model(
        "default", lora_config, gradient_accumulation_steps=GRADIENT_ACCUMULATION_STEPS
    )
    model.set_loss("GRPOLoss", epsilon=0.2, beta=0.0)
    model.set_optimizer("AdamW", lr=LEARNING_RATE)
    model.set_lr_scheduler(
        "CosineWarmupScheduler", num_warmup_steps=500, num_training_steps=max_steps
    )
    model.set_processor("InputProcessor")
    model.set_template("Template", model_id=MODEL_ID)

    sampler = vLLMSampler(model_id=MODEL_ID)
    sampler.set_template("Template", model_id=MODEL_ID)
    advantage_fn = GRPOAdvantage()
    metrics = CompletionRewardMetric()
    sampling_params = {"max_tokens": max_new_tokens, "temperature": TEMPERATURE, "top_p": 0.95}

    current_adapter_uri = None
    for step, batch in enumerate(dataloader):
        if step >= max_steps:
            break
        metrics.reset()
        prompts = batch if isinstance(batch, list) else [batch]

        # 1. Save the adapter and sample with it (the remote form of a weight sync).
        if step % SYNC_INTERVAL == 0:
            current_adapter_uri = model.save(name=f"grpo-sampler-step-{step}", save_optimizer=False)
            logger.info(f"Step {step}: saved weights to {current_adapter_uri}")

        # 2. Sample completions.
        sample_response = sampler.sample(
            inputs=prompts,
            sampling_params=sampling_params,
            adapter_uri=current_adapter_uri,
            num_samples=NUM_GENERATIONS,
        )
        input_features, old_logps_list, completion_lengths = [], [], []
        for seq in sample_response.get("sequences", []):
            input_features.append(seq.get("new_input_feature", seq))
            # the sampler's (token_id, logprob) pairs per position, as the documents pass them
            old_logps_list.append(seq.get("logprobs", []))
            completion_lengths.append(len(seq.get("tokens", [])))

        # 3. Rewards, computed here: they are client code.
        total_rewards, format_rewards, accuracy_rewards = compute_rewards(input_features)
        metrics.accumulate(
            None,
            None,
            completion_lengths=completion_lengths,
            rewards={
                "total": total_rewards,
                "format": format_rewards,
                "accuracy": accuracy_rewards,
            },
        )

        # 4. Advantages, relative to each prompt's group of samples.
        advantages = advantage_fn(
            total_rewards, num_generations=NUM_GENERATIONS, scale="group"
        ).tolist()
        frac_zero_std = 1.0 if all(abs(a) < 1e-8 for a in advantages) else 0.0
        if frac_zero_std == 1.0:
            logger.info(f"Step {step}: all advantages are zero, skipping training")
            continue

        # 5. The GRPO step on the server.
        model.forward_backward(
            inputs=input_features, advantages=advantages, old_logps=old_logps_list
        )
        model.clip_grad_norm(1.0)
        model.step()
        model.zero_grad()
        model.lr_step()

        log_dict = metrics.calculate()
        log_dict.update(model.calculate_metric())
        log_dict["train/frac_reward_zero_std"] = frac_zero_std
        logger.info(f"Step {step}: {log_dict}")

    twinkle_path = model.save(name="grpo-countdown-final", save_optimizer=True)
    logger.info(f"Saved final checkpoint: {twinkle_path}")
    client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base-url", default=os.environ.get("TWINKLE_SERVER_URL", "http://127.0.0.1:8000")
    )
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    train(args.base_url, args.max_steps, args.max_new_tokens)
