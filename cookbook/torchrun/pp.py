"""Pipeline parallel: the decoder's layers split into stages over the ranks of ``pp``.

    torchrun --nproc_per_node=2 cookbook/torchrun/pp.py   # pp=2
    torchrun --nproc_per_node=4 cookbook/torchrun/pp.py   # pp=2 × tp=2
    torchrun --nproc_per_node=8 cookbook/torchrun/pp.py   # pp=2 × tp=2 × dp=2

The documents' mesh, ``DeviceMesh.from_sizes(pp_size=2, tp_size=2, dp_size=2)``, sized to the
processes: ``pp_size=2``, ``tp_size=2`` where four or more processes run (each stage's layers
split over two ranks by the family's tensor-parallel plan), dp the rest (FSDP2 per stage).
The first stage holds the embedding and
the first layer of the bundled tiny model, the last one the second layer, the norm and the
head; each batch runs through them in micro-batches of 2 rows with the 1F1B schedule. The
loop is the single-device one. ``TWINKLE_MAX_STEPS`` stops it early; the adapter is saved
once at the end, gathered from both stages into one peft folder.
"""

import os

from peft import LoraConfig

import twinkle
from twinkle import DeviceMesh, Platform, get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.model.transformers.strategy.pipeline import PipelineConfig
from twinkle.preprocessor import SelfCognitionProcessor

WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
MAX_STEPS = int(os.environ.get("TWINKLE_MAX_STEPS", "0")) or None
PP_SIZE = 2
TP_SIZE = 2 if WORLD_SIZE % 4 == 0 else 1

device_mesh = DeviceMesh.from_sizes(
    world_size=WORLD_SIZE,
    pp_size=PP_SIZE,
    tp_size=TP_SIZE,
    dp_size=WORLD_SIZE // (PP_SIZE * TP_SIZE),
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
    model = TransformersModel(
        model_id="bundled://tiny-qwen3", pipeline_parallel=PipelineConfig(schedule="1F1B")
    )
    lora = LoraConfig(r=8, lora_alpha=32, target_modules="all-linear")
    model.add_adapter_to_model("default", lora)
    model.set_optimizer(optimizer_cls="AdamW", lr=1e-4)
    for step, batch in enumerate(dataloader):
        model.forward_backward(inputs=batch, micro_batch_size=2)
        model.clip_grad_and_step()
        if step % 10 == 0:
            metric = model.calculate_metric(is_training=True)
            logger.info(f"step {step} of {len(dataloader)}, metric: {metric}")
        if MAX_STEPS is not None and step + 1 >= MAX_STEPS:
            break
    path = model.save("last-checkpoint", output_dir="output")
    logger.info(f"saved {path}")


if __name__ == "__main__":
    train()
