"""Expert parallel: each rank holds half of a Mixture-of-Experts model's experts.

    torchrun --nproc_per_node=2 cookbook/torchrun/ep.py

The documents write ``DeviceMesh.from_sizes(world_size=8, dp_size=4, ep_size=2)``; here
the mesh takes the processes torchrun started, with ``ep_size=2``. No MoE model is
bundled, so a tiny Qwen3-MoE (4 experts, top-2) is built from a config with the bundled
tokenizer's vocabulary. Tokens travel to the rank holding their experts and back by
all-to-all; the dense layers are data parallel (FSDP2 here: EP is carved from fsdp) and
the experts are sharded over ep_fsdp. ``TWINKLE_MAX_STEPS`` stops it early.
"""

import os

from transformers import AutoConfig

import twinkle
from twinkle import DeviceMesh, Platform, get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.model.transformers.moe.expert_parallel import ExpertParallelConfig
from twinkle.preprocessor import SelfCognitionProcessor

WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
MAX_STEPS = int(os.environ.get("TWINKLE_MAX_STEPS", "0")) or None

device_mesh = DeviceMesh.from_sizes(
    world_size=WORLD_SIZE,
    dp_size=WORLD_SIZE // 2,
    ep_size=2,
    device_type=Platform.detect_device_type(),
)
twinkle.initialize(mode="local", global_device_mesh=device_mesh)
logger = get_logger()

TINY_MOE = AutoConfig.for_model(
    "qwen3_moe",
    vocab_size=3909,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    pad_token_id=0,
)


def train():
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition"))
    dataset.set_template("Qwen3_5Template", model_id="bundled://tiny-qwen3")
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    dataloader = DataLoader(dataset=dataset, batch_size=8)
    model = TransformersModel(
        config=TINY_MOE,
        expert_parallel=ExpertParallelConfig(enabled=True, router_dtype="fp32"),
    )
    model.set_optimizer(optimizer_cls="AdamW", lr=1e-3)
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
