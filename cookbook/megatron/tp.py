"""The documents' Megatron layout (``DeviceMesh.from_sizes(pp_size=2, tp_size=2, dp_size=2)``)
with their training loop, under torchrun; on CPUs too, in MegatronModel's CPU (gloo) mode.

    torchrun --nproc_per_node=8 cookbook/megatron/tp.py                     # dp2 × tp2 × pp2
    torchrun --nproc_per_node=2 cookbook/megatron/tp.py                     # tp2
    TP_SIZE=1 PP_SIZE=2 torchrun --nproc_per_node=2 cookbook/megatron/tp.py  # pp2
    TP_SIZE=1 torchrun --nproc_per_node=2 cookbook/megatron/tp.py           # dp2

``TP_SIZE`` (default 2) and ``PP_SIZE`` (default 2 from four processes on, else 1) pick the
layout; data parallel takes the remaining processes. Changed from the documents: the ids
(``bundled://tiny-qwen3``, ``bundled://self-cognition``) and the mesh's device type, which
comes from the machine. Without a GPU, MegatronModel runs on the CPU by itself: slow, for
checking a layout on a laptop. The loop is the single-GPU one, unchanged: the mesh alone
makes it parallel. ``TWINKLE_MAX_STEPS`` stops it early (the tests use it). The
checkpoint is one peft folder gathered from the shards: ``output/last-checkpoint``.
"""

import os

from peft import LoraConfig

import twinkle
from twinkle import DeviceMesh, Platform, get_device_placement, get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import MegatronModel
from twinkle.preprocessor import SelfCognitionProcessor

MODEL_ID = os.environ.get("MODEL_ID", "bundled://tiny-qwen3")
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
TP_SIZE = int(os.environ.get("TP_SIZE", min(2, WORLD_SIZE)))
PP_SIZE = int(os.environ.get("PP_SIZE", 2 if WORLD_SIZE >= 4 else 1))
MAX_STEPS = int(os.environ.get("TWINKLE_MAX_STEPS", "0")) or None

# pp=2, tp=2, dp=2 on eight processes
device_mesh = DeviceMesh.from_sizes(
    pp_size=PP_SIZE,
    tp_size=TP_SIZE,
    dp_size=WORLD_SIZE // (TP_SIZE * PP_SIZE),
    device_type=Platform.detect_device_type(),
)
# use torchrun mode
twinkle.initialize(mode="local", global_device_mesh=device_mesh)

logger = get_logger()


def train():
    # 1000 samples
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition", data_slice=range(1000)))
    # Set template to prepare encoding
    dataset.set_template("Qwen3_5Template", model_id=MODEL_ID)
    # Preprocess the dataset to standard format
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    # Encode dataset
    dataset.encode()
    # Global batch size = 8
    dataloader = DataLoader(dataset=dataset, batch_size=8)
    # Use a MegatronModel: the global mesh lays it out
    model = MegatronModel(model_id=MODEL_ID)

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
