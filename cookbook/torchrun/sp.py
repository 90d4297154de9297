"""Ulysses sequence parallel: each rank of an SP group trains on a slice of every sequence.

    torchrun --nproc_per_node=2 cookbook/torchrun/sp.py

The documents write ``DeviceMesh.from_sizes(world_size=8, dp_size=2, ulysses_size=4)``;
the bundled tiny model has 2 key/value heads, so here ``ulysses_size=2`` and dp takes the
rest of the processes. Both Ulysses peers read the same batch (the DataLoader slices by
data rank, which Ulysses peers share); attention runs on the full sequence, heads split
across the peers. The loop is the single-device one. ``TWINKLE_MAX_STEPS`` stops it early.
"""

import os

import twinkle
from twinkle import DeviceMesh, Platform, get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.model.transformers.strategy.sequence_parallel import SequenceParallelConfig
from twinkle.preprocessor import SelfCognitionProcessor

WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
MAX_STEPS = int(os.environ.get("TWINKLE_MAX_STEPS", "0")) or None
ULYSSES_SIZE = 2

device_mesh = DeviceMesh.from_sizes(
    world_size=WORLD_SIZE,
    dp_size=WORLD_SIZE // ULYSSES_SIZE,
    ulysses_size=ULYSSES_SIZE,
    device_type=Platform.detect_device_type(),
)
twinkle.initialize(mode="local", global_device_mesh=device_mesh)
logger = get_logger()


def train():
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition"))
    dataset.set_template("Qwen3_5Template", model_id="bundled://tiny-qwen3")
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    dataloader = DataLoader(dataset=dataset, batch_size=4)
    model = TransformersModel(
        model_id="bundled://tiny-qwen3",
        sequence_parallel=SequenceParallelConfig(enabled=True, gather_logits=True),
    )
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
