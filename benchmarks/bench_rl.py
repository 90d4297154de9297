"""RL components: TorchSampler generation against transformers' ``generate``, weight sync
time and bytes, and the stages of one GRPO step.

1. **Generation**: the same prompts (8 rows of the bundled chat template, uneven lengths),
   ``--new-tokens`` new tokens each, sampling at temperature 1, KV cache on both sides:
   ``TorchSampler.sample`` (which also builds SampledSequences with logprobs and
   ``new_input_feature``s) against ``model.generate(do_sample=True, output_scores=False)``
   on the same weights, on the bundled tiny model (0.3M parameters) and a ~50M Qwen3-shaped
   model (hidden 512, 14 layers, random init). Tokens/s counts the tokens actually generated;
   medians of ``--repeats`` alternating runs. Target: ratio >= 1.0x.
2. **Weight sync** of the ~50M model into a TorchSampler in process: a full (merged) sync
   against a LoRA-only sync (r=8, all-linear), time and bytes; and the same two over
   torch.distributed (``BroadcastEngine``, gloo, 2 processes on this machine, 64 MiB
   buckets). Then across two Ray groups (a 'model' and a 'sampler' worker, local CPU
   cluster, ``--bucket-mib`` buckets): the bucketed broadcast (``transport='broadcast'``, the
   default) against the
   shared checkpoint folder (``transport='folder'``), for a full-weight model and a LoRA
   adapter; seconds are the driver's wall time of ``sync_weights`` (median of ``--repeats``
   after one warm-up sync that also links the groups), MB/s = bytes moved / seconds.
3. **One GRPO step** on the ~50M model with LoRA, 4 prompts x 4 samples, 32 new tokens:
   sample, reward, train (``forward_backward`` + ``clip_grad_and_step``), sync (LoRA).

    .venv/bin/python benchmarks/bench_rl.py [--repeats 3] [--new-tokens 32]

Wall and CPU seconds are both reported: on a shared machine wall time also measures the
neighbours; the CPU-time ratio is the fairer verdict. ``OMP_NUM_THREADS`` defaults to 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# One thread by default: on a shared machine more threads make both sides measure the
# neighbours (busy-waiting threads even inflate CPU time); set it for a quiet machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import Qwen3Config  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from provenance import commit  # noqa: E402

from twinkle.checkpoint_engine import CheckpointEngineManager  # noqa: E402
from twinkle.data_format import SamplingParams  # noqa: E402
from twinkle.model import TransformersModel  # noqa: E402
from twinkle.reward import GSM8KAccuracyReward, GSM8KFormatReward  # noqa: E402
from twinkle.sampler import TorchSampler  # noqa: E402

TINY = "bundled://tiny-qwen3"
QUESTIONS = [
    "What is 2 + 3?",
    "Who are you?",
    "Write one sentence about the sea and the sky at night.",
    "Name a colour.",
    "How many legs does a spider have, and why?",
    "Say hello.",
    "What is the capital of France? Answer briefly, please.",
    "Count to five.",
]


def medium_config() -> Qwen3Config:
    base = TorchSampler(TINY).model.config.to_dict()
    base.update(
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=14,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        layer_types=["full_attention"] * 14,
    )
    return Qwen3Config.from_dict(base)


def build_sampler(size: str) -> TorchSampler:
    sampler = TorchSampler(TINY) if size == "tiny" else TorchSampler(config=medium_config())
    sampler.set_template("Qwen3_5Template", model_id=TINY)
    return sampler


def prompts() -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": q}], "user_data": [{"answer": "5"}]}
        for q in QUESTIONS
    ]


def timed(fn, *args, **kwargs):
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def bench_generation(size: str, repeats: int, new_tokens: int) -> dict:
    sampler = build_sampler(size)
    template = sampler.template
    features = [template.encode(p, add_generation_prompt=True) for p in prompts()]
    width = max(len(f.input_ids) for f in features)
    ids = torch.zeros((len(features), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, feature in enumerate(features):
        ids[row, width - len(feature.input_ids) :] = torch.as_tensor(feature.input_ids)
        mask[row, width - len(feature.input_ids) :] = 1
    stops = sorted(sampler._stop_token_ids(template))
    params = SamplingParams(max_tokens=new_tokens, temperature=1.0)

    def ours():
        responses = sampler.sample(features, params)
        return sum(len(s.tokens) for r in responses for s in r.sequences)

    def theirs():
        with torch.no_grad():
            out = sampler.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                eos_token_id=stops,
                pad_token_id=0,
            )
        generated = out[:, width:]
        # Count up to and including each row's first stop token, as the sampler does.
        count = 0
        for row in generated.tolist():
            hits = [i for i, t in enumerate(row) if t in stops]
            count += hits[0] + 1 if hits else len(row)
        return count

    ours(), theirs()  # warm-up
    rates = {"twinkle": [], "generate": [], "twinkle_cpu": [], "generate_cpu": []}
    for _ in range(repeats):
        for name, fn in (("twinkle", ours), ("generate", theirs)):
            tokens, wall, cpu = timed(fn)
            rates[name].append(tokens / wall)
            rates[f"{name}_cpu"].append(tokens / cpu)
    return {k: statistics.median(v) for k, v in rates.items()}


def lora() -> LoraConfig:
    return LoraConfig(r=8, lora_alpha=32, target_modules="all-linear")


def bench_sync_in_process(repeats: int) -> dict:
    config = medium_config()
    model = TransformersModel(config=config)
    model.add_adapter_to_model("default", lora())
    results = {}
    for merge in (True, False):
        sampler = TorchSampler(config=config)
        manager = CheckpointEngineManager(model, sampler)
        first = manager.sync_weights(merge_and_sync=merge)
        runs = [manager.sync_weights(merge_and_sync=merge) for _ in range(repeats)]
        results["full (merged)" if merge else "LoRA only"] = {
            "first_bytes": first.bytes,
            "bytes": runs[0].bytes,
            "seconds": statistics.median(r.seconds for r in runs),
        }
    return results


def broadcast_worker(out: str, repeats: int) -> None:
    """Run under torchrun: rank 0 trains-side, rank 1 sampler-side."""
    import torch.distributed as dist

    from twinkle.checkpoint_engine import BroadcastEngine

    dist.init_process_group("gloo")
    config = medium_config()
    engine = BroadcastEngine(src=0, bucket_bytes=64 * 2**20)
    rows = {}
    for merge in (True, False):
        if dist.get_rank() == 0:
            model = TransformersModel(config=config)
            model.add_adapter_to_model("default", lora())
            manager = CheckpointEngineManager(model, None, engine)
            sync, sync_args = manager.sync_weights, {"merge_and_sync": merge}
        else:
            sync, sync_args = engine.receive, {"sampler": TorchSampler(config=config)}
        sync(**sync_args)
        runs = []
        for _ in range(repeats):
            dist.barrier()
            runs.append(sync(**sync_args))
        rows["full (merged)" if merge else "LoRA only"] = {
            "bytes": runs[0].bytes,
            "seconds": statistics.median(r.seconds for r in runs),
        }
    if dist.get_rank() == 1:  # the receiver's clock covers the whole transfer
        Path(out).write_text(json.dumps(rows))
    dist.destroy_process_group()


def bench_sync_broadcast(repeats: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "broadcast.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            __file__,
            "--broadcast-worker",
            str(out),
            "--repeats",
            str(repeats),
        ]
        subprocess.run(command, env=env, check=True, capture_output=True, timeout=900)
        return json.loads(out.read_text())


def bench_sync_between_groups(repeats: int, bucket_mib: int) -> dict:
    """Bucketed broadcast vs shared folder between a 'model' and a 'sampler' Ray group."""
    import twinkle
    from twinkle import DeviceGroup

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    twinkle.initialize(
        "ray",
        groups=[
            DeviceGroup(name="model", ranks=1, device_type="cpu"),
            DeviceGroup(name="sampler", ranks=1, device_type="cpu"),
        ],
        lazy_collect=False,
    )
    config = medium_config()
    rows = {}
    for kind in ("full weights", "LoRA only"):
        model = TransformersModel(config=config, remote_group="model")
        if kind == "LoRA only":
            model.add_adapter_to_model("default", lora())
        for transport in ("broadcast", "folder"):
            sampler = TorchSampler(config=config, remote_group="sampler")
            manager = CheckpointEngineManager(
                model, sampler, transport=transport, bucket_bytes=bucket_mib * 2**20
            )
            merge = kind == "full weights"
            manager.sync_weights(merge_and_sync=merge)  # links the groups, sends the base once
            runs = [timed(manager.sync_weights, merge_and_sync=merge) for _ in range(repeats)]
            seconds = statistics.median(wall for _, wall, _ in runs)
            rows[(kind, transport)] = {"bytes": runs[0][0].bytes, "seconds": seconds}
            del manager, sampler
    return rows


def grpo_rewards(features: list) -> list[float]:
    accuracy, form = GSM8KAccuracyReward()(features), GSM8KFormatReward()(features)
    # A small ramp keeps the advantages non-zero on a random model that never scores.
    return [a + f + 0.01 * i for i, (a, f) in enumerate(zip(accuracy, form, strict=True))]


def grpo_train(model: TransformersModel, seqs: list, rewards: list[float]) -> None:
    mean = sum(rewards) / len(rewards)
    model.forward_backward(
        inputs=[s.new_input_feature for s in seqs],
        old_logps=[[p[0][1] for p in s.logprobs] for s in seqs],
        advantages=[r - mean for r in rewards],
    )
    model.clip_grad_and_step()


def bench_grpo_step(repeats: int, new_tokens: int) -> dict:
    config = medium_config()
    model = TransformersModel(config=config)
    model.add_adapter_to_model("default", lora())
    model.set_template("Qwen3_5Template", model_id=TINY)
    model.set_loss("GRPOLoss")
    model.set_optimizer("AdamW", lr=1e-4)
    sampler = TorchSampler(config=config)
    sampler.set_template("Qwen3_5Template", model_id=TINY)
    manager = CheckpointEngineManager(model, sampler)
    manager.sync_weights(merge_and_sync=False)
    params = SamplingParams(max_tokens=new_tokens, temperature=1.0)
    stages: dict[str, list[float]] = {"sample": [], "reward": [], "train": [], "sync": []}
    for _ in range(repeats + 1):
        responses, sample_s, _ = timed(sampler.sample, prompts()[:4], params, num_samples=4)
        seqs = [s for r in responses for s in r.sequences]
        rewards, reward_s, _ = timed(grpo_rewards, [s.new_input_feature for s in seqs])
        _, train_s, _ = timed(grpo_train, model, seqs, rewards)
        _, sync_s, _ = timed(manager.sync_weights, merge_and_sync=False)
        for key, value in zip(stages, (sample_s, reward_s, train_s, sync_s), strict=True):
            stages[key].append(value)
    return {k: statistics.median(v[1:]) for k, v in stages.items()}  # first run: warm-up


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--broadcast-worker", help=argparse.SUPPRESS)
    parser.add_argument("--skip-broadcast", action="store_true")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument(
        "--bucket-mib", type=int, default=16, help="Ray broadcast bucket size (the default's)"
    )
    args = parser.parse_args()
    if args.broadcast_worker:
        broadcast_worker(args.broadcast_worker, args.repeats)
        return
    torch.manual_seed(0)
    print(
        f"# bench-rl {datetime.date.today()} {platform.machine()} Python "
        f"{platform.python_version()} commit {commit()} threads {torch.get_num_threads()}"
    )
    print("\n## Generation tokens/s (8 prompts, sampling, KV cache)\n")
    print("| model | TorchSampler | generate | ratio (wall) | ratio (CPU) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for size in ("tiny", "~50M"):
        r = bench_generation(size, args.repeats, args.new_tokens)
        print(
            f"| {size} | {r['twinkle']:,.0f} | {r['generate']:,.0f} | "
            f"{r['twinkle'] / r['generate']:.2f}x | {r['twinkle_cpu'] / r['generate_cpu']:.2f}x |"
        )
    print("\n## Weight sync, ~50M model (LoRA r=8 all-linear)\n")
    print("| transport | kind | first sync bytes | bytes per sync | seconds per sync |")
    print("| --- | --- | ---: | ---: | ---: |")
    for kind, r in bench_sync_in_process(args.repeats).items():
        print(
            f"| in process | {kind} | {r['first_bytes']:,} | {r['bytes']:,} | {r['seconds']:.4f} |"
        )
    if not args.skip_broadcast:
        for kind, r in bench_sync_broadcast(args.repeats).items():
            print(
                f"| gloo broadcast, 2 processes | {kind} | | {r['bytes']:,} | {r['seconds']:.4f} |"
            )
    if not args.skip_ray:
        print(
            "\n## Weight sync across two Ray groups, ~50M model (1 model + 1 sampler worker, "
            f"{args.bucket_mib} MiB buckets)\n"
        )
        print("| kind | transport | bytes per sync | seconds per sync | MB/s | vs folder |")
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        rows = bench_sync_between_groups(args.repeats, args.bucket_mib)
        for (kind, transport), r in rows.items():
            folder = rows[(kind, "folder")]["seconds"]
            print(
                f"| {kind} | {transport} | {r['bytes']:,} | {r['seconds']:.3f} | "
                f"{r['bytes'] / r['seconds'] / 1e6:,.0f} | {folder / r['seconds']:.2f}x |"
            )
    print("\n## One GRPO step, ~50M model with LoRA (4 prompts x 4 samples)\n")
    stages = bench_grpo_step(args.repeats, args.new_tokens)
    total = sum(stages.values())
    print("| stage | seconds | share |")
    print("| --- | ---: | ---: |")
    for stage, seconds in stages.items():
        print(f"| {stage} | {seconds:.3f} | {seconds / total:.0%} |")


if __name__ == "__main__":
    main()
