"""Two DeviceGroups: the model trains on one, its data is read on another.

    python cookbook/ray/two_groups.py

The layout RL needs (a model group and a sampler group), shown with parts that
exist on any machine: a 'model' group of ``TWINKLE_RANKS`` workers (default 2,
data parallel) holds the TransformersModel, and a 'data' group of one worker
holds the DataLoader, which builds its Dataset there from a factory. With
``lazy_collect=True`` each batch stays in Ray's object store: the model
workers fetch it from the data worker and take their ``slice_dp`` share, so
the driver only ever sees the metrics it prints. The loop is the
single-device one; only ``initialize`` and the ``remote_group`` arguments
are about Ray. ``TWINKLE_MAX_STEPS`` stops it early.
"""

import os

import twinkle
from twinkle import DeviceGroup, DeviceMesh, Platform, get_device_placement
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.infra.ray.traffic import count_driver_traffic
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor

MODEL_ID = "bundled://tiny-qwen3"
RANKS = int(os.environ.get("TWINKLE_RANKS", "2"))
MAX_STEPS = int(os.environ.get("TWINKLE_MAX_STEPS", "0")) or None
DEVICE = Platform.detect_device_type()


def create_dataset():
    """Runs on the data worker: the rows never leave it except as batches for the model."""
    dataset = Dataset(DatasetMeta("bundled://self-cognition"))
    dataset.set_template("Qwen3_5Template", model_id=MODEL_ID)
    dataset.map(SelfCognitionProcessor("Twinkle", "ModelScope"))
    dataset.encode()
    return dataset


def main():
    device_groups = [
        DeviceGroup(name="model", ranks=RANKS, device_type=DEVICE),
        DeviceGroup(name="data", ranks=1, device_type="cpu"),
    ]
    model_mesh = DeviceMesh.from_sizes(dp_size=RANKS, device_type=DEVICE)
    twinkle.initialize(mode="ray", groups=device_groups, lazy_collect=True)

    model = TransformersModel(model_id=MODEL_ID, device_mesh=model_mesh, remote_group="model")
    model.set_optimizer("AdamW", lr=1e-3)
    dataloader = DataLoader(
        dataset=create_dataset, batch_size=8, device_mesh=model_mesh, remote_group="data"
    )
    print(get_device_placement())

    with count_driver_traffic() as traffic:
        for step, batch in enumerate(dataloader):
            if MAX_STEPS is not None and step >= MAX_STEPS:
                break
            model.forward_backward(inputs=batch)
            model.clip_grad_and_step()
            metric = model.calculate_metric(is_training=True)
            print(f"step {step} of {len(dataloader)}: {metric}")
    print(f"bytes through the driver: sent {traffic.sent}, received {traffic.received}")


if __name__ == "__main__":
    main()
