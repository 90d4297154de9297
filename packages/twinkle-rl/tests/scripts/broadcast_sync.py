"""Rank 0 trains a LoRA model and syncs it over gloo in small buckets; rank 1 receives into a
TorchSampler, samples, and rank 0 scores the sample: both write what they saw as JSON."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig

from twinkle.checkpoint_engine import BroadcastEngine, CheckpointEngineManager
from twinkle.data_format import SamplingParams
from twinkle.model import TransformersModel
from twinkle.sampler import TorchSampler

MODEL_ID = "bundled://tiny-qwen3"
PROMPT = [{"messages": [{"role": "user", "content": "Who are you?"}]}]
TRAIN = [{"messages": [*PROMPT[0]["messages"], {"role": "assistant", "content": "Twinkle."}]}] * 4


def train_step(model):
    model.forward_backward(inputs=TRAIN)
    model.clip_grad_and_step()


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    engine = BroadcastEngine(src=0, bucket_bytes=64 * 1024)
    result = {"rank": rank, "syncs": [], "gaps": []}
    if rank == 0:
        model = TransformersModel(model_id=MODEL_ID, device="cpu")
        model.add_adapter_to_model(
            "default", LoraConfig(r=4, lora_alpha=16, target_modules="all-linear")
        )
        model.set_template("Qwen3_5Template")
        model.set_optimizer("AdamW", lr=2e-2)
        manager = CheckpointEngineManager(model, None, engine)
    else:
        sampler = TorchSampler(MODEL_ID, device="cpu")
        sampler.set_template("Qwen3_5Template")
    for _ in range(2):
        if rank == 0:
            train_step(model)
            stats = manager.sync_weights(merge_and_sync=False)
        else:
            stats = engine.receive(sampler)
        result["syncs"].append([stats.bytes, stats.buckets, list(stats.kinds)])
        box = [None]
        if rank == 1:
            seq = sampler.sample(PROMPT, SamplingParams(max_tokens=12, seed=0))[0].sequences[0]
            box = [(seq.new_input_feature.to_json(), [p[0][1] for p in seq.logprobs])]
        dist.broadcast_object_list(box, src=1)
        if rank == 0:
            from twinkle.data_format import InputFeature

            feature = InputFeature.from_json(box[0][0])
            logps = model.forward_only(inputs=[feature]).logps[0]
            trainer = logps[torch.as_tensor(feature.labels) != -100].float()
            gap = (trainer - torch.tensor(box[0][1])).abs().max()
            result["gaps"].append(float(gap))
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    # NOTE: gloo's C++ teardown can abort a rank ("terminate called without an active
    # exception") when its peer closes the sockets first, even after a barrier. Every rank has
    # written its results, so it leaves without running the destructors.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
