"""Megatron on Ascend NPUs through MindSpeed: LoRA on Qwen3-4B, dp2 × tp2 × pp2 on eight cards.

    ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 torchrun --nproc_per_node=8 tp_npu.py

Needs torch_npu, CANN and MindSpeed (see INSTALL_MEGATRON.sh and the NPU guide); it checks
for them first and stops with what is missing, so on a machine without an NPU it fails at
that check. The same layout runs on GPUs or CPUs with ``cookbook/megatron/tp.py``.
``tp_moe_npu.py`` and ``tp_moe_cp_npu.py`` run this loop with a MoE model and expert (and
context) parallel. ``MODEL_ID``, ``DATASET_ID`` and ``MAX_STEPS`` override the defaults.
"""

import os

from peft import LoraConfig

import twinkle
from twinkle import DeviceMesh, get_device_placement, get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import MegatronModel
from twinkle.model.megatron._mindspeed_runtime import ensure_mindspeed_adaptor_patched, require_npu
from twinkle.preprocessor import SelfCognitionProcessor

MODEL_ID = os.environ.get("MODEL_ID", "ms://Qwen/Qwen3-4B")
DATASET_ID = os.environ.get("DATASET_ID", "ms://swift/self-cognition")
MAX_STEPS = int(os.environ.get("MAX_STEPS", 10))
# dp2 × tp2 × pp2: the GPU reference layout, on eight NPUs
SIZES = {"dp_size": 2, "tp_size": 2, "pp_size": 2}

logger = get_logger()


def build_dataset(model_id: str = MODEL_ID, rows: int = 256):
    dataset = Dataset(dataset_meta=DatasetMeta(DATASET_ID, data_slice=range(rows)))
    # Qwen3 is a text-only model: the base template
    dataset.set_template("Template", model_id=model_id, max_length=512)
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    return dataset


def build_mesh(sizes: dict[str, int]) -> DeviceMesh:
    return DeviceMesh.from_sizes(**sizes, device_type="npu")


def train(sizes: dict[str, int] = SIZES, model_id: str = MODEL_ID, batch_size: int = 8) -> None:
    # the device check: torch_npu with a visible NPU, and MindSpeed patched into megatron-core
    require_npu("cookbook/megatron/ascend")
    ensure_mindspeed_adaptor_patched()
    twinkle.initialize(mode="local", global_device_mesh=build_mesh(sizes))

    dataset = build_dataset(model_id)
    dataloader = DataLoader(dataset=dataset, batch_size=batch_size, num_workers=0)
    model = MegatronModel(model_id=model_id)
    lora_config = LoraConfig(r=8, lora_alpha=32, target_modules="all-linear")
    model.add_adapter_to_model("default", lora_config)
    model.set_optimizer(optimizer_cls="default", lr=1e-4)
    model.set_lr_scheduler(
        scheduler_cls="default", lr_warmup_steps=2, lr_decay_steps=len(dataloader)
    )
    logger.info(get_device_placement())
    logger.info(model.get_train_configs())
    for step, batch in enumerate(dataloader):
        if step >= MAX_STEPS:
            break
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
        metric = model.calculate_metric(is_training=True)
        logger.info(f"[NPU] step {step + 1}/{MAX_STEPS}, metric: {metric}")


if __name__ == "__main__":
    train()
