"""Weight sync trainer -> vLLMSampler on CUDA, full and LoRA-only, timed and checked.

A Qwen3-8B-shaped model (random init; vLLM starts from its own dummy weights, so only a
sync makes the two agree) is synced into a vLLMSampler by ``CheckpointEngineManager``:

1. full weights (``merge_and_sync=True``), ``--repeats`` times: seconds and GB/s of each;
   then the engine's logprobs of its own samples must equal the trainer's (mean absolute
   gap under ``--tol``), which they cannot before the sync;
2. LoRA-only (r=16, all-linear, after one training step): the first sync of a new manager
   sends the unmerged base and the adapter, each later one the adapter only (timed), and the
   engine's LoRA logprobs must match the trainer's again.

Where: with one GPU, trainer and engine share it and the sync is in process (the colocated
layout; NCCL cannot put two ranks on one device). With two or more, ``--nccl`` runs the
trainer on GPU 0 and the engine on GPU 1 under torchrun, over ``BroadcastEngine`` on NCCL.
Issue 20's target: a 7-8B model in at most 3 s.

    python benchmarks/gpu/check_weight_sync_gpu.py [--shape qwen3-8b] [--repeats 3] [--nccl]

Needs a CUDA GPU (about 80 GB at the default shape) and vLLM. ``--dry-run`` prints the plan
(shape, parameters, engine arguments) without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from random_model import config_of, write  # noqa: E402

PROMPTS = [
    {"messages": [{"role": "user", "content": "What is 12 + 30?"}]},
    {"messages": [{"role": "user", "content": "Name three colours."}]},
]
ENGINE_ARGS = {
    "load_format": "dummy",
    "gpu_memory_utilization": 0.3,
    "max_model_len": 1024,
    "enable_lora": True,
    "max_lora_rank": 16,
}


def gap(model, sequences) -> float:
    """Mean |trainer logp - engine logp| over the sampled tokens."""
    diffs = []
    for seq in sequences:
        feature = seq.new_input_feature
        logps = model.forward_only(inputs=[feature]).logps[0]
        trainer = logps[torch.as_tensor(feature.labels) != -100].float().cpu()
        diffs.append((trainer - torch.tensor([p[0][1] for p in seq.logprobs])).abs())
    return float(torch.cat(diffs).mean())


def _sample(sampler):
    from twinkle.data_format import SamplingParams

    params = SamplingParams(max_tokens=16, temperature=1.0, seed=0, logprobs=1)
    return [s for r in sampler.sample(PROMPTS, params, num_samples=2) for s in r.sequences]


def _trainer(shape: str, device: str):
    from twinkle.model import TransformersModel

    with torch.device(device):
        model = TransformersModel(config=config_of(shape), device=device)
    return model


def in_process(args: argparse.Namespace, folder: Path) -> dict:
    from peft import LoraConfig

    from twinkle.checkpoint_engine import CheckpointEngineManager
    from twinkle.sampler import vLLMSampler

    sampler = vLLMSampler(model_id=str(folder), engine_args=ENGINE_ARGS)  # first: its memory
    sampler.set_template("Qwen3_5Template")
    model = _trainer(args.shape, "cuda")
    result = {"layout": "in-process, one GPU", "shape": args.shape}
    manager = CheckpointEngineManager(model, sampler)
    stale = gap(model, _sample(sampler))
    full = [manager.sync_weights(merge_and_sync=True) for _ in range(args.repeats)]
    synced = gap(model, _sample(sampler))
    result["full"] = {
        "seconds": [s.seconds for s in full],
        "gb": full[-1].bytes / 1e9,
        "gap_before": stale,
        "gap_after": synced,
        "ok": synced < args.tol < stale,
    }
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
    model.add_adapter_to_model("default", lora)
    model.set_template("Qwen3_5Template")
    model.set_optimizer("AdamW", lr=1e-3)
    model.forward_backward(inputs=[s.new_input_feature for s in _sample(sampler)])
    model.clip_grad_and_step()
    lora_manager = CheckpointEngineManager(model, sampler)
    first = lora_manager.sync_weights(merge_and_sync=False)
    later = [lora_manager.sync_weights(merge_and_sync=False) for _ in range(args.repeats)]
    lora_gap = gap(model, _sample(sampler))
    result["lora"] = {
        "first_seconds": first.seconds,
        "first_kinds": list(first.kinds),
        "seconds": [s.seconds for s in later],
        "kinds": list(later[-1].kinds),
        "mb": later[-1].bytes / 1e6,
        "gap": lora_gap,
        "ok": lora_gap < args.tol and "base" not in later[-1].kinds,
    }
    return result


def nccl_child(args: argparse.Namespace, folder: Path) -> None:
    """torchrun rank 0: the trainer on cuda:0; rank 1: the engine on cuda:1; NCCL between."""
    import torch.distributed as dist

    from twinkle.checkpoint_engine import BroadcastEngine, CheckpointEngineManager

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    engine = BroadcastEngine(src=0, device=f"cuda:{rank}")
    if rank == 0:
        manager = CheckpointEngineManager(_trainer(args.shape, "cuda:0"), None, engine)
        stats = [manager.sync_weights(merge_and_sync=True) for _ in range(args.repeats)]
        seconds = [s.seconds for s in stats]
        print(json.dumps({"layout": "NCCL, GPU 0 -> GPU 1", "full_seconds": seconds}))
    else:
        from twinkle.sampler import vLLMSampler

        sampler = vLLMSampler(model_id=str(folder), engine_args=ENGINE_ARGS)
        for _ in range(args.repeats):
            engine.receive(sampler)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3-8b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tol", type=float, default=0.05)
    parser.add_argument("--nccl", action="store_true", help="two GPUs: trainer 0, engine 1")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    config = config_of(args.shape)
    if args.dry_run:
        print(json.dumps({"shape": args.shape, "layers": config.num_hidden_layers,
                          "hidden": config.hidden_size, "engine_args": ENGINE_ARGS}))  # fmt: skip
        return 0
    if args.child is not None:
        nccl_child(args, args.child)
        return 0
    if not torch.cuda.is_available():
        print("check_weight_sync_gpu: needs a CUDA GPU and vLLM")
        return 2
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    folder = write(args.shape, Path(tempfile.mkdtemp(prefix="twinkle-sync-")), weights=False)
    if args.nccl:
        if torch.cuda.device_count() < 2:
            print("check_weight_sync_gpu: --nccl needs two GPUs (NCCL refuses two ranks on one)")
            return 2
        script = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", __file__]
        flags = ["--shape", args.shape, "--repeats", str(args.repeats), "--child", str(folder)]
        return subprocess.run([*script, *flags]).returncode
    result = in_process(args, folder)
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result))
    return 0 if result["full"]["ok"] and result["lora"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
