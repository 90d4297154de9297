"""The user's documents' single-GPU example, unchanged except for its ids.

``ms://swift/self-cognition`` became ``bundled://self-cognition`` and
``ms://Qwen/Qwen3.5-4B`` became ``bundled://tiny-qwen3``, so it runs anywhere,
offline, on a CPU. The bundled set has 100 rows, so ``data_slice=range(1000)``
keeps those 100 (DatasetMeta logs that it asked for more). LoRA at lr 1e-4 is the
documents' fine-tuning setting for a pretrained model: on the randomly initialised
tiny model the loss barely moves (``cookbook/quickstart.py`` trains it properly).
The checkpoint goes to ``output/last-checkpoint`` under the working directory.
"""

from peft import LoraConfig

from twinkle import get_device_placement, get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor

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
    model.save(f"last-checkpoint")  # noqa: F541  (as the documents write it)


if __name__ == "__main__":
    train()
