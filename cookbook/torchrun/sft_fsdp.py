"""The user's documents' torchrun example (FSDP2 × data parallel), runnable on the CPUs here.

    torchrun --nproc_per_node=2 cookbook/torchrun/sft_fsdp.py

The documents build ``DeviceMesh.from_sizes(fsdp_size=4, dp_size=2)`` for eight GPUs;
here the mesh takes the processes torchrun started: fsdp=4 × dp=2 on eight, dp=2 ×
fsdp=WORLD/2 (HSDP) on any other even count of at least four, fsdp=WORLD (FSDP2) on
two. Only the ids changed (``bundled://tiny-qwen3``, ``bundled://self-cognition``)
and the device type comes from the machine, so gloo runs it on CPUs. The training
loop is the single-GPU one, unchanged: the mesh alone makes it parallel.
``TWINKLE_MAX_STEPS`` stops it early (the tests use it). The checkpoint is one peft
folder, gathered from the shards: ``output/last-checkpoint``.
"""

import os

from peft import LoraConfig

import twinkle
from twinkle import DeviceMesh, Platform, get_device_placement, get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor

WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
MAX_STEPS = int(os.environ.get("TWINKLE_MAX_STEPS", "0")) or None
DP_SIZE = 2 if WORLD_SIZE >= 4 and WORLD_SIZE % 2 == 0 else 1

# Construct a device_mesh, fsdp=4, dp=2 on eight processes
device_mesh = DeviceMesh.from_sizes(
    fsdp_size=WORLD_SIZE // DP_SIZE, dp_size=DP_SIZE, device_type=Platform.detect_device_type()
)
# use torchrun mode
twinkle.initialize(mode="local", global_device_mesh=device_mesh)

logger = get_logger()


def train():
    # 1000 samples
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition", data_slice=range(1000)))
    # Set template to prepare encoding
    dataset.set_template("Qwen3_5Template", model_id="bundled://tiny-qwen3")
    # Preprocess the dataset to standard format
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    # Encode dataset
    dataset.encode()
    # Global batch size = 8, for GPUs, so 1 sample per GPU
    dataloader = DataLoader(dataset=dataset, batch_size=8)
    # Use a TransformersModel
    model = TransformersModel(model_id="bundled://tiny-qwen3")

    lora_config = LoraConfig(r=8, lora_alpha=32, target_modules="all-linear")

    # Add a lora to model, with name `default`
    # Comment this to use full-parameter training
    model.add_adapter_to_model("default", lora_config, gradient_accumulation_steps=2)
    # Add Optimizer for lora `default`
    model.set_optimizer(optimizer_cls="AdamW", lr=1e-4)
    # Add LRScheduler for lora `default`
    model.set_lr_scheduler(
        scheduler_cls="CosineWarmupScheduler",
        num_warmup_steps=5,
        num_training_steps=len(dataloader),
    )
    logger.info(get_device_placement())
    # Print the training config
    logger.info(model.get_train_configs())
    logger.info(f"Total steps: {len(dataloader)}")
    for step, batch in enumerate(dataloader):
        # Do forward and backward
        model.forward_backward(inputs=batch)
        # Step
        model.clip_grad_and_step()
        if step % 20 == 0:
            # Print metric
            metric = model.calculate_metric(is_training=True)
            logger.info(f"Current is step {step} of {len(dataloader)}, metric: {metric}")
        if MAX_STEPS is not None and step + 1 >= MAX_STEPS:
            break
    model.save("last-checkpoint")


if __name__ == "__main__":
    train()
