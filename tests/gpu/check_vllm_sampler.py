"""vLLMSampler on a real GPU: it samples, its logprobs match the trainer's, and weight sync
(full, then LoRA) makes the engine compute the trained model's logprobs.

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python tests/gpu/check_vllm_sampler.py \
        [--model-id Qwen/Qwen3-0.6B] [--tol 0.05]

Run it in an environment with ``twinkle-rl[vllm]`` (vLLM pins its own torch). The model must
be on the machine (a local folder or a cached hub id). Checks, each printed PASS/FAIL:

1. ``sample`` returns ``num_samples`` sequences per prompt with ``new_input_feature``;
2. the engine's logprobs of its own samples equal TorchSampler's for the same sequences
   (mean absolute difference below ``--tol``: vLLM runs bf16 kernels, the trainer float32);
3. after training a LoRA adapter for a few steps and ``sync_weights(merge_and_sync=True)``,
   the engine's logprobs track the trained model (the gap shrinks by half or more);
4. ``merge_and_sync=False`` installs the adapter as a LoRARequest with the same effect.

Exits non-zero on any failure. Not run in CI (no GPU there).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from peft import LoraConfig

from twinkle.checkpoint_engine import CheckpointEngineManager
from twinkle.data_format import SamplingParams
from twinkle.model import TransformersModel
from twinkle.sampler import vLLMSampler

PROMPTS = [
    {"messages": [{"role": "user", "content": "What is 12 + 30? Answer with '#### <n>'."}]},
    {"messages": [{"role": "user", "content": "Name three colours."}]},
]


def gap(model: TransformersModel, response_sequences: list) -> float:
    """Mean |trainer logp - sampler logp| over the sampled tokens."""
    diffs = []
    for seq in response_sequences:
        feature = seq.new_input_feature
        logps = model.forward_only(inputs=[feature]).logps[0]
        trainer = logps[torch.as_tensor(feature.labels) != -100].float()
        sampled = torch.tensor([p[0][1] for p in seq.logprobs])
        diffs.append((trainer - sampled).abs())
    return float(torch.cat(diffs).mean())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-id", default="Qwen/Qwen3-0.6B")
    parser.add_argument("--tol", type=float, default=0.05)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    failures = 0

    def check(name: str, ok: bool, detail: str) -> None:
        nonlocal failures
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    sampler = vLLMSampler(
        model_id=args.model_id,
        engine_args={
            "gpu_memory_utilization": 0.3,
            "max_model_len": 1024,
            "enable_lora": True,
            "max_lora_rank": 8,
            "enable_prefix_caching": True,
        },
    )
    sampler.set_template("Qwen3_5Template")
    params = SamplingParams(max_tokens=32, temperature=1.0, seed=0, logprobs=2)
    responses = sampler.sample(PROMPTS, params, num_samples=4)
    seqs = [s for r in responses for s in r.sequences]
    check(
        "sample",
        len(responses) == 2 and len(seqs) == 8 and all(s.new_input_feature for s in seqs),
        f"{len(seqs)} sequences",
    )

    model = TransformersModel(model_id=args.model_id, device="cuda")
    before = gap(model, seqs)
    check("logprobs match the trainer", before < args.tol, f"mean gap {before:.4f}")

    model.add_adapter_to_model(
        "default", LoraConfig(r=8, lora_alpha=32, target_modules="all-linear")
    )
    model.set_template("Qwen3_5Template")
    model.set_optimizer("AdamW", lr=5e-4)
    train = [s.new_input_feature for s in seqs]
    for _ in range(5):
        model.forward_backward(inputs=train)
        model.clip_grad_and_step()
    stale = gap(model, seqs)
    CheckpointEngineManager(model, sampler).sync_weights(merge_and_sync=True)
    sampler.reset_prefix_cache()
    fresh = [s for r in sampler.sample(PROMPTS, params, num_samples=4) for s in r.sequences]
    synced = gap(model, fresh)
    check("merged sync", synced < max(args.tol, stale / 2), f"stale {stale:.4f} -> {synced:.4f}")

    # A new manager sends the unmerged base weights once, then the adapter as a LoRARequest.
    for _ in range(3):
        model.forward_backward(inputs=train)
        model.clip_grad_and_step()
    stats = CheckpointEngineManager(model, sampler).sync_weights(merge_and_sync=False)
    sampler.reset_prefix_cache()
    fresh = [s for r in sampler.sample(PROMPTS, params, num_samples=4) for s in r.sequences]
    lora_gap = gap(model, fresh)
    check("LoRA sync", lora_gap < args.tol * 2, f"kinds {stats.kinds}, gap {lora_gap:.4f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
