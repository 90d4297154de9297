"""The user's documents' Ray example, unchanged except for its ids and sizes.

    python cookbook/ray/sft.py

It attaches to a running Ray cluster (``ray start --head``, as the documents
start one) or, when none runs, starts a local one. The documents reserve a
group of eight GPUs and build ``DeviceMesh.from_sizes(fsdp_size=4, dp_size=2)``;
here the group has ``TWINKLE_RANKS`` workers (default 2) on the machine's
device (CPUs here, so gloo) and the mesh follows the torchrun example's rule:
fsdp=4 × dp=2 on eight, dp=2 × fsdp=RANKS/2 on another even count of at least
four, fsdp=RANKS on two. The ids became ``bundled://self-cognition`` and
``bundled://tiny-qwen3``. The dataset and the dataloader run in this process;
the model lives on the group's workers, and each global batch of 8 is split
over its data ranks by ``forward_backward``'s ``slice_dp`` dispatch.
``TWINKLE_MAX_STEPS`` stops it early (the tests use it). The checkpoint is
written by the workers, under the directory Ray started them in (this one, for
a local cluster).
"""

import os

from peft import LoraConfig

import twinkle
from twinkle import DeviceGroup, DeviceMesh, Platform, get_device_placement
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor

RANKS = int(os.environ.get("TWINKLE_RANKS", "2"))
MAX_STEPS = int(os.environ.get("TWINKLE_MAX_STEPS", "0")) or None
DP_SIZE = 2 if RANKS >= 4 and RANKS % 2 == 0 else 1
DEVICE = Platform.detect_device_type()

device_group = [DeviceGroup(name="default", ranks=RANKS, device_type=DEVICE)]
device_mesh = DeviceMesh.from_sizes(fsdp_size=RANKS // DP_SIZE, dp_size=DP_SIZE, device_type=DEVICE)
# local for torchrun
twinkle.initialize(mode="ray", groups=device_group, global_device_mesh=device_mesh)


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
    dataloader = DataLoader(dataset=dataset, batch_size=8, min_batch_size=8)
    # Use a TransformersModel
    model = TransformersModel(model_id="bundled://tiny-qwen3", remote_group="default")

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
    print(get_device_placement())
    for step, batch in enumerate(dataloader):
        if MAX_STEPS is not None and step >= MAX_STEPS:
            break
        # Do forward and backward
        model.forward_backward(inputs=batch)
        # Step
        model.clip_grad_and_step()
        if step % 20 == 0:
            # Print metric
            metric = model.calculate_metric(is_training=True)
            print(f"Current is step {step} of {len(dataloader)}, metric: {metric}")
    model.save("last-checkpoint")


if __name__ == "__main__":
    train()
