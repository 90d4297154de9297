"""The documents' full FSDP2 example with resume (the Qwen3.5 best-practice page's training
loop, with the resume page's save and resume_from_checkpoint), runnable on the CPUs here.

    torchrun --nproc_per_node=8 cookbook/transformers/fsdp2.py   # fsdp=4 × dp=2, as written
    torchrun --nproc_per_node=2 cookbook/transformers/fsdp2.py   # fsdp=2 on two CPU processes

Only the ids changed (``bundled://tiny-qwen3``, ``bundled://self-cognition``) and the mesh
takes the processes torchrun started (fsdp=WORLD/2 × dp=2 on an even count of at least four,
fsdp=WORLD otherwise), with the device type of the machine. Environment knobs, for the
tests and for trying resume by hand:

- ``RESUME_FROM_CHECKPOINT``: a checkpoint folder to continue from
  (``./output/fsdp2/last-checkpoint`` after a first run); empty: start afresh.
- ``RESUME_ONLY_MODEL=1``: restore the weights only, not the optimizer, scheduler and RNG.
- ``IGNORE_DATA_SKIP=1``: do not skip the samples the checkpoint had consumed.
- ``TWINKLE_MAX_STEPS``: stop after that many batches; ``TWINKLE_LOG_EVERY``: log the
  training metric every that many batches (20); ``TWINKLE_EVAL_EVERY``: evaluate, and save
  ``checkpoint-<step>`` when the eval loss is the best so far, every that many (40).
"""

import os
from pathlib import Path

from peft import LoraConfig
from tqdm import tqdm

import twinkle
from twinkle import DeviceMesh, Platform, get_device_placement, get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor

WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
DP_SIZE = 2 if WORLD_SIZE >= 4 and WORLD_SIZE % 2 == 0 else 1
MAX_STEPS = int(os.environ.get("TWINKLE_MAX_STEPS", "0")) or None
LOG_EVERY = int(os.environ.get("TWINKLE_LOG_EVERY", "20"))
EVAL_EVERY = int(os.environ.get("TWINKLE_EVAL_EVERY", "40"))
MODEL_ID = "bundled://tiny-qwen3"
DATASET_ID = "bundled://self-cognition"
ADAPTER_NAME = "default"
OUTPUT_DIR = "./output/fsdp2"

RESUME_FROM_CHECKPOINT = os.environ.get("RESUME_FROM_CHECKPOINT", "")
RESUME_ONLY_MODEL = os.environ.get("RESUME_ONLY_MODEL") == "1"  # True: weights only
IGNORE_DATA_SKIP = os.environ.get("IGNORE_DATA_SKIP") == "1"  # True: do not skip data

# fsdp=4, dp=2 on eight cards
device_mesh = DeviceMesh.from_sizes(
    fsdp_size=WORLD_SIZE // DP_SIZE, dp_size=DP_SIZE, device_type=Platform.detect_device_type()
)
# use torchrun mode
twinkle.initialize(mode="local", global_device_mesh=device_mesh)

logger = get_logger()


def eval(model):
    # Validation set: 100 samples
    dataset = Dataset(dataset_meta=DatasetMeta(DATASET_ID, data_slice=range(100)))
    dataset.set_template("Qwen3_5Template", model_id=MODEL_ID)
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    dataloader = DataLoader(dataset=dataset, batch_size=8)
    for batch in tqdm(dataloader):
        model.forward_only(inputs=batch)
        model.calculate_loss()
    metrics = model.calculate_metric(is_training=False)
    return metrics


def save(model, dataloader, checkpoint_name):
    return model.save(
        checkpoint_name,
        output_dir=OUTPUT_DIR,
        adapter_name=ADAPTER_NAME,
        save_optimizer=True,  # the optimizer state, for resuming
        consumed_train_samples=dataloader.get_state()["consumed_train_samples"],
    )


def train():
    # Training set: 1000 samples (the bundled set has 100)
    dataset = Dataset(dataset_meta=DatasetMeta(DATASET_ID, data_slice=range(1000)))
    # Set the template to prepare encoding
    dataset.set_template("Qwen3_5Template", model_id=MODEL_ID)
    # Fill the placeholders of the self-cognition data
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    # Encode the dataset
    dataset.encode()
    # Global batch size = 8: one sample per card on eight cards
    dataloader = DataLoader(dataset=dataset, batch_size=8)
    model = TransformersModel(model_id=MODEL_ID)

    lora_config = LoraConfig(r=8, lora_alpha=32, target_modules="all-linear")
    # Add a LoRA adapter named 'default'; comment this out for full-parameter training
    model.add_adapter_to_model(ADAPTER_NAME, lora_config, gradient_accumulation_steps=2)
    model.set_optimizer(optimizer_cls="AdamW", lr=1e-4)
    model.set_lr_scheduler(
        scheduler_cls="CosineWarmupScheduler",
        num_warmup_steps=5,
        num_training_steps=len(dataloader),
    )

    if RESUME_FROM_CHECKPOINT:
        checkpoint_path = str(Path(RESUME_FROM_CHECKPOINT).expanduser().resolve())
        progress = model.resume_from_checkpoint(
            checkpoint_path, resume_only_model=RESUME_ONLY_MODEL
        )
        if not IGNORE_DATA_SKIP:
            dataloader.resume_from_checkpoint(progress["consumed_train_samples"])
        logger.info(f"Resumed from {checkpoint_path}: {progress}")

    logger.info(get_device_placement())
    logger.info(model.get_train_configs())
    logger.info(f"Total steps: {len(dataloader)}")
    loss_metric = 99.0
    for step, batch in enumerate(dataloader):
        # Forward and backward
        model.forward_backward(inputs=batch)
        # Clip the gradients and step the optimizer (every second batch: accumulation 2)
        model.clip_grad_and_step()
        if step % LOG_EVERY == 0:
            metric = model.calculate_metric(is_training=True)
            logger.info(f"Current is step {step} of {len(dataloader)}, metric: {metric}")
        if step > 0 and step % EVAL_EVERY == 0:
            # Evaluate from time to time and keep the best checkpoint
            metrics = eval(model)
            logger.info(f"Eval metric: {metrics}")
            if loss_metric > float(metrics["loss"]):
                save(model, dataloader, f"checkpoint-{step}")
                loss_metric = float(metrics["loss"])
        if MAX_STEPS is not None and step + 1 >= MAX_STEPS:
            break
    path = save(model, dataloader, "last-checkpoint")
    logger.info(f"Saved {path}")


if __name__ == "__main__":
    train()
