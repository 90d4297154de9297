"""Context parallel (ring attention): each rank of a cp group trains on its share of every
long row, keys and values passed round the ring.

    torchrun --nproc_per_node=2 cookbook/torchrun/cp.py

``cp_size=2`` over the two processes (on more, fsdp takes the rest: fsdp × cp, FSDP2 over
both). The batches are padding-free: a DataLoader batch of 8 conversations is packed into
one long row, which each cp rank splits in the load-balanced zigzag order (chunks r and
2 × cp - 1 - r of 2 × cp), so no rank holds the whole row's activations or its keys and
values; ring attention keeps the packed sequences apart. Unlike Ulysses, the heads need not
divide the group. ``TWINKLE_MAX_STEPS`` stops it early.
"""

import os

import twinkle
from twinkle import DeviceMesh, Platform, get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.processor import InputProcessor

WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
MAX_STEPS = int(os.environ.get("TWINKLE_MAX_STEPS", "0")) or None
CP_SIZE = 2

device_mesh = DeviceMesh.from_sizes(
    fsdp_size=WORLD_SIZE // CP_SIZE,
    cp_size=CP_SIZE,
    device_type=Platform.detect_device_type(),
)
twinkle.initialize(mode="local", global_device_mesh=device_mesh)
logger = get_logger()


def train():
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition"))
    dataset.set_template("Qwen3_5Template", model_id="bundled://tiny-qwen3")
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    dataloader = DataLoader(dataset=dataset, batch_size=8)
    model = TransformersModel(model_id="bundled://tiny-qwen3")
    model.set_processor(InputProcessor, padding_free=True)
    model.set_optimizer(optimizer_cls="AdamW", lr=1e-4)
    for step, batch in enumerate(dataloader):
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
        if step % 10 == 0:
            metric = model.calculate_metric(is_training=True)
            logger.info(f"step {step} of {len(dataloader)}, metric: {metric}")
        if MAX_STEPS is not None and step + 1 >= MAX_STEPS:
            break


if __name__ == "__main__":
    train()
