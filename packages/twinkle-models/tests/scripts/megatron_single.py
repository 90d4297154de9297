"""One CPU process: MegatronModel's training contract against TransformersModel.

Usage: python megatron_single.py OUT_DIR. Writes ``OUT_DIR/single.json`` with the figures
the test asserts on: losses of the documents' loop (AdamW + the 'default' scheduler) next
to TransformersModel's, micro-batching, gradient accumulation, the three-call step,
forward_only without labels, an exact resume, a GRPO step, packed (padding-free) batches,
and the bad inputs that need megatron-core.
A separate process, because Megatron's parallel state is global. No GPU: MegatronModel
runs in its CPU mode (``twinkle.model.megatron.cpu_mode``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from twinkle import DeviceMesh
from twinkle.model import MegatronModel, TransformersModel
from twinkle.processor import InputProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron_parallel import MODEL, features  # noqa: E402

LR = 1e-3


def setup(model, scheduler: bool = True):
    model.set_optimizer("default", lr=LR)
    if scheduler:
        model.set_lr_scheduler("default", lr_decay_steps=6, max_lr=LR, lr_warmup_steps=1)
    return model


def train(model, feats, steps: int, **forward_kwargs) -> list[float]:
    losses = []
    for _ in range(steps):
        losses.append(model.forward_backward(feats, **forward_kwargs).loss)
        model.clip_grad_and_step(1.0)
    return losses


def error_of(call) -> str | None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the message is what the test checks
        return f"{type(exc).__name__}: {exc}"
    return None


def main() -> None:
    out_dir = Path(sys.argv[1])
    feats = features()
    out = {}

    megatron = setup(MegatronModel(MODEL, device="cpu"))
    reference = setup(TransformersModel(MODEL, device="cpu"))
    out["losses"] = train(megatron, feats, 4)
    out["reference_losses"] = train(reference, feats, 4)
    out["metrics"] = megatron.calculate_metric()
    out["reference_metrics"] = reference.calculate_metric()
    out["train_configs"] = megatron.get_train_configs()

    # Micro-batches of 2 rows, and 2 calls accumulated into one step, equal one full batch.
    one = setup(MegatronModel(MODEL, device="cpu"), scheduler=False)
    micro = setup(MegatronModel(MODEL, device="cpu"), scheduler=False)
    accumulated = setup(MegatronModel(MODEL, device="cpu"), scheduler=False)
    three_call = setup(MegatronModel(MODEL, device="cpu"), scheduler=False)
    out["one_batch"] = train(one, feats, 2) + [one.forward_only(feats).loss]
    out["micro_batches"] = train(micro, feats, 2, micro_batch_size=2) + [
        micro.forward_only(feats).loss
    ]
    for _ in range(2):
        accumulated.forward_backward(feats[:1])
        accumulated.clip_grad_and_step(1.0, gradient_accumulation_steps=2)
        accumulated.forward_backward(feats[1:])
        accumulated.clip_grad_and_step(1.0, gradient_accumulation_steps=2)
    out["accumulated"] = accumulated.forward_only(feats).loss
    for _ in range(2):
        three_call.forward_backward(feats)
        three_call.clip_grad_norm(1.0)
        three_call.step()
        three_call.zero_grad()
    out["three_call"] = three_call.forward_only(feats).loss
    no_labels = [{k: v for k, v in dict(f).items() if k != "labels"} for f in feats]
    unlabelled = one.forward_only(no_labels)
    out["no_labels"] = {"loss": unlabelled.loss, "logps_numel": int(unlabelled.logps.numel())}

    # Exact resume: 2 steps, save, a fresh model resumes and runs 2 more = 4 uninterrupted.
    first = setup(MegatronModel(MODEL, device="cpu"))
    train(first, feats, 2)
    path = first.save("step2", out_dir / "checkpoints", consumed_train_samples=8)
    resumed = setup(MegatronModel(MODEL, device="cpu"))
    out["progress"] = resumed.resume_from_checkpoint(path)
    out["resumed_losses"] = train(resumed, feats, 2)
    out["checkpoint_files"] = sorted(
        str(p.relative_to(path)) for p in Path(path).rglob("*") if p.is_file()
    )
    exported = TransformersModel(path, device="cpu")
    out["hf_load_logps_diff"] = float(
        (exported.forward_only(feats).logps - first.forward_only(feats).logps).abs().max()
    )

    # The documents' RL step: GRPOLoss with per-sequence advantages and old logps, the
    # per-row loss arguments split with the micro-batches.
    rl_losses = {}
    for name, model in (
        ("megatron", setup(MegatronModel(MODEL, device="cpu"), scheduler=False)),
        ("reference", setup(TransformersModel(MODEL, device="cpu"), scheduler=False)),
    ):
        old_logps = model.forward_only(feats).logps
        model.set_loss("GRPOLoss", epsilon=0.2)
        advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
        kwargs = {"micro_batch_size": 2} if name == "megatron" else {}
        rl_losses[name] = train(
            model, feats, 2, old_logps=old_logps, advantages=advantages, **kwargs
        )
    out["grpo_losses"], out["grpo_reference_losses"] = rl_losses["megatron"], rl_losses["reference"]

    # Packed (padding-free) batches: the same losses and per-token logps, in the packed layout,
    # as TransformersModel on the same packed row; GRPO's per-token old_logps packed as well.
    packed = InputProcessor(padding_free=True)(feats)
    runs = {}
    for name, model in (
        ("megatron", setup(MegatronModel(MODEL, device="cpu"), scheduler=False)),
        ("reference", setup(TransformersModel(MODEL, device="cpu"), scheduler=False)),
    ):
        initial_logps = model.forward_only(packed).logps
        losses = train(model, packed, 2)
        old_logps = model.forward_only(packed).logps
        model.set_loss("GRPOLoss", epsilon=0.2)
        # per token, as TransformersModel takes them on a packed row
        advantages = torch.repeat_interleave(
            torch.tensor([1.0, -0.5, 0.5, 0.25]), packed["cu_seq_lens_q"].diff()
        ).view(1, -1)
        rl = {"old_logps": old_logps, "advantages": advantages}
        losses += train(model, packed, 1, **rl)
        runs[name] = (losses, initial_logps)
    out["packed"] = {
        "losses": runs["megatron"][0],
        "reference_losses": runs["reference"][0],
        "logps_shape": list(runs["megatron"][1].shape),
        "input_shape": list(packed["input_ids"].shape),
        "logps_max_diff": float((runs["megatron"][1] - runs["reference"][1]).abs().max()),
    }

    out["errors"] = {
        "optimizer": error_of(lambda: one.set_optimizer("Adagrad", lr=1e-3)),
        "optimizer_kwarg": error_of(lambda: one.set_optimizer("AdamW", lr=1e-3, foo=1)),
        "adapter": error_of(lambda: one.add_adapter_to_model("default", None)),
        "left_padding": error_of(
            lambda: one.forward_backward(InputProcessor(padding_side="left")(feats))
        ),
        "micro_batch": error_of(lambda: one.forward_backward(feats, micro_batch_size=3)),
        "world": error_of(
            lambda: MegatronModel(MODEL, device_mesh=DeviceMesh.from_sizes(dp_size=2))
        ),
        "no_tokens": error_of(
            lambda: one.forward_backward(
                [{**dict(f), "labels": [-100] * len(f["labels"])} for f in feats]
            )
        ),
    }
    out["still_trains"] = one.forward_only(feats).loss
    (out_dir / "single.json").write_text(json.dumps(out))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
