"""The documents' Ray GRPO sample with ``MegatronModel`` (GSM8K, model and sampler on two
DeviceGroups), on CPUs: the model group runs Megatron in its CPU (gloo) mode.

    python cookbook/megatron/grpo_ray.py    # a local Ray cluster: 1 model + 1 sampler worker
    MODEL_GPUS=2 SAMPLER_GPUS=1 python cookbook/megatron/grpo_ray.py   # Megatron dp2

Changed from the documents as in ``cookbook/rl/grpo_ray.py`` (bundled ids, ``TorchSampler``
for ``vLLMSampler``, CPU device groups, small sizes, ``num_samples`` for the repeated prompt
list), and one more: the weight sync goes through a checkpoint folder
(``transport='folder'``): MegatronModel saves its adapter in peft's names, which the sampler
loads; the default broadcast reads a Hugging Face module, which a Megatron model does not
hold. ``MIXED_PRECISION`` (default 'bf16', as the documents) picks the model's precision;
``TWINKLE_MAX_STEPS`` (or ``MAX_STEPS``) bounds the run.
"""

import os
from typing import Any

from peft import LoraConfig

import twinkle
from twinkle import DeviceGroup, DeviceMesh, get_device_placement
from twinkle.advantage import GRPOAdvantage
from twinkle.checkpoint_engine import CheckpointEngineManager
from twinkle.data_format import SamplingParams
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.metric import CompletionRewardMetric
from twinkle.model.megatron import MegatronModel
from twinkle.preprocessor.llm import GSM8KProcessor
from twinkle.processor import InputProcessor
from twinkle.reward import GSM8KAccuracyReward, GSM8KFormatReward
from twinkle.sampler import TorchSampler

MODEL_ID = os.environ.get("MODEL_ID", "bundled://tiny-qwen3")
MIXED_PRECISION = os.environ.get("MIXED_PRECISION", "bf16")
MODEL_GPUS = int(os.environ.get("MODEL_GPUS", 1))
SAMPLER_GPUS = int(os.environ.get("SAMPLER_GPUS", 1))
NUM_GPUS = MODEL_GPUS + SAMPLER_GPUS
NUM_GENERATIONS = int(os.environ.get("NUM_GENERATIONS", 4))
MAX_NEW_TOKENS = int(os.environ.get("MAX_NEW_TOKENS", 32))
LEARNING_RATE = float(os.environ.get("LR", 1e-5))
MAX_STEPS = int(os.environ.get("TWINKLE_MAX_STEPS", os.environ.get("MAX_STEPS", 4)))
BATCH_SIZE = int(os.environ.get("BATCH_SIZE", 4))  # prompts per step
MINI_BATCH_SIZE = int(os.environ.get("MINI_BATCH_SIZE", 8))  # completions per optimizer step
MICRO_BATCH_SIZE = int(os.environ.get("MICRO_BATCH_SIZE", 2))
GRADIENT_ACCUMULATION_STEPS = int(os.environ.get("GRADIENT_ACCUMULATION_STEPS", 1))
ADAPTER_NAME = "default"


def create_gsm8k_dataset():
    dataset = Dataset(DatasetMeta("bundled://gsm8k", subset_name="main", split="train"))
    dataset.set_template("Qwen3_5Template", model_id=MODEL_ID, max_length=2048)
    dataset.map(GSM8KProcessor())
    dataset.encode(add_generation_prompt=True)
    return dataset


def compute_rewards(
    trajectories: list[dict[str, Any]],
) -> tuple[list[float], list[float], list[float]]:
    accuracy_reward_fn = GSM8KAccuracyReward()
    format_reward_fn = GSM8KFormatReward()
    accuracy_rewards = accuracy_reward_fn(trajectories)
    format_rewards = format_reward_fn(trajectories)
    total_rewards = [a + f for a, f in zip(accuracy_rewards, format_rewards, strict=True)]
    return total_rewards, format_rewards, accuracy_rewards


def main():
    # set sampler and model separate to use different devices
    device_groups = [
        # A CPU group takes a process count; on GPUs these are device lists, as documented.
        DeviceGroup(name="model", ranks=MODEL_GPUS, device_type="cpu"),
        DeviceGroup(name="sampler", ranks=SAMPLER_GPUS, device_type="cpu"),
    ]
    model_mesh = DeviceMesh.from_sizes(world_size=MODEL_GPUS, dp_size=MODEL_GPUS, device_type="cpu")
    sampler_mesh = DeviceMesh.from_sizes(
        world_size=SAMPLER_GPUS, dp_size=SAMPLER_GPUS, device_type="cpu"
    )
    twinkle.initialize(
        mode="ray", nproc_per_node=NUM_GPUS, groups=device_groups, lazy_collect=False
    )

    lora_config = LoraConfig(target_modules="all-linear", r=32, lora_alpha=64, lora_dropout=0.05)
    model = MegatronModel(
        model_id=MODEL_ID,
        device_mesh=model_mesh,
        remote_group="model",
        mixed_precision=MIXED_PRECISION,
    )
    model.add_adapter_to_model(ADAPTER_NAME, lora_config, gradient_accumulation_steps=1)
    model.set_optimizer("default", lr=LEARNING_RATE)
    model.set_lr_scheduler("default", lr_decay_steps=MAX_STEPS, max_lr=LEARNING_RATE)
    model.set_loss("GRPOLoss", epsilon=0.2)
    model.set_processor(InputProcessor)
    model.set_template("Qwen3_5Template", model_id=MODEL_ID)

    sampler = TorchSampler(
        model_id=MODEL_ID,
        engine_args={
            "gpu_memory_utilization": 0.8,
            "max_model_len": 4096,
            "max_lora_rank": 32,  # save as lora_config
            "enable_lora": True,
        },
        device_mesh=sampler_mesh,
        remote_group="sampler",
    )
    sampler.set_template("Qwen3_5Template", model_id=MODEL_ID)
    ckpt_manager = CheckpointEngineManager(model=model, sampler=sampler, transport="folder")
    dataloader = DataLoader(
        dataset=create_gsm8k_dataset,
        batch_size=BATCH_SIZE * GRADIENT_ACCUMULATION_STEPS,
        min_batch_size=BATCH_SIZE * GRADIENT_ACCUMULATION_STEPS,
        device_mesh=model_mesh,
        remote_group="model",
    )
    advantage_fn = GRPOAdvantage()
    metrics = CompletionRewardMetric()
    sampling_params = SamplingParams(max_tokens=MAX_NEW_TOKENS, num_samples=1, logprobs=1)
    optim_step = 0
    print(get_device_placement())

    for batch in dataloader:
        if optim_step >= MAX_STEPS:
            break
        metrics.reset()
        global_prompts = batch if isinstance(batch, list) else [batch]
        ckpt_manager.sync_weights(merge_and_sync=False)
        sampler.reset_prefix_cache()
        sample_responses = sampler.sample(
            global_prompts, sampling_params, num_samples=NUM_GENERATIONS
        )
        all_input_data: list[dict[str, Any]] = []
        all_old_logps: list[list[float]] = []
        all_completion_lengths: list[int] = []

        for sample_response in sample_responses:
            for sequence in sample_response.sequences:
                all_input_data.append(sequence.new_input_feature)
                all_old_logps.append([logprob[0][1] for logprob in sequence.logprobs])
                all_completion_lengths.append(len(sequence.tokens))
        total_rewards, format_rewards, accuracy_rewards = compute_rewards(all_input_data)
        metrics.accumulate(
            completion_lengths=all_completion_lengths,
            rewards={
                "total": total_rewards,
                "format": format_rewards,
                "accuracy": accuracy_rewards,
            },
        )
        advantages = advantage_fn(
            total_rewards, num_generations=NUM_GENERATIONS, scale="group"
        ).tolist()
        # Split completions into mini-batches and run one optim step per mini-batch.
        total_completions = len(all_input_data)
        for mb_start in range(0, total_completions, MINI_BATCH_SIZE):
            mb_end = min(mb_start + MINI_BATCH_SIZE, total_completions)
            mb_inputs = all_input_data[mb_start:mb_end]
            mb_old_logps = all_old_logps[mb_start:mb_end]
            mb_advantages = advantages[mb_start:mb_end]

            model.forward_backward(
                inputs=mb_inputs,
                old_logps=mb_old_logps,
                advantages=mb_advantages,
                micro_batch_size=MICRO_BATCH_SIZE,
            )
            model.clip_grad_and_step()
            optim_step += 1

            if optim_step >= MAX_STEPS:
                break
        log_dict = metrics.calculate()
        log_dict.update(model.calculate_metric(is_training=True))
        metrics.reset()
        print(f"[Step {optim_step}/{MAX_STEPS}] {log_dict}")

    print(f"Training completed. optim_steps={optim_step}")
    model.save("grpo-gsm8k-checkpoint")


if __name__ == "__main__":
    main()
