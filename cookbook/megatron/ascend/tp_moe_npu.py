"""Megatron on Ascend NPUs: LoRA on Qwen3-30B-A3B (MoE) with expert parallel, on eight cards.

    ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 torchrun --nproc_per_node=8 tp_moe_npu.py

tp2 × pp2 × dp2 with sequence parallel, the experts split over ep2; the loop and the
device check are tp_npu.py's.
"""

import os

from tp_npu import train

MODEL_ID = os.environ.get("MODEL_ID", "ms://Qwen/Qwen3-30B-A3B")
# tp > 1 on a MoE model: Megatron requires sequence parallel
SIZES = {"dp_size": 2, "tp_size": 2, "pp_size": 2, "ep_size": 2, "sequence_parallel": True}

if __name__ == "__main__":
    train(SIZES, MODEL_ID, batch_size=4)
