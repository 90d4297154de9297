"""Kill a checkpoint save in one window, then recover in a new process; test_checkpoint_crash
runs it.

    python checkpoint_crash.py save OUT POINT   # 2 steps, save c0; 2 steps (losses logged),
                                                # save ref (the same state), then overwrite
                                                # c0 with a pause at POINT: the test kills it
    python checkpoint_crash.py resume OUT       # resume c0 (and ref) afresh, train 2 steps

LoRA with dropout, so the torch RNG restored by a resume shows in the losses. Results go
to OUT/<mode>.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from peft import LoraConfig

from twinkle.model import TransformersModel
from twinkle.model.checkpoint_recovery import PAUSE_ENV
from twinkle.template import build_template

BASE = "bundled://tiny-qwen3"


def make_model() -> TransformersModel:
    model = TransformersModel(BASE, device="cpu")
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear")
    model.add_adapter_to_model("default", config)
    model.set_optimizer("AdamW", lr=1e-2)
    return model


def make_batch() -> list:
    template = build_template("Qwen3_5Template", model_id=BASE)
    turns = [{"role": "user", "content": "who are you?"}, {"role": "assistant", "content": "me"}]
    return template.batch_encode([{"messages": turns}] * 2)


def train(model: TransformersModel, batch: list, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        losses.append(model.forward_backward(inputs=batch).loss)
        model.clip_grad_and_step()
    return losses


def save(out: Path, point: str) -> None:
    torch.manual_seed(0)
    model, batch = make_model(), make_batch()
    train(model, batch, 2)
    model.save("c0", output_dir=out / "ckpt")
    after_c0 = train(model, batch, 2)
    model.save("ref", output_dir=out / "ckpt")
    (out / "save.json").write_text(json.dumps({"after_c0": after_c0}))
    os.environ[PAUSE_ENV] = f"{point}:c0"
    model.save("c0", output_dir=out / "ckpt")  # overwrite; pauses at POINT
    raise SystemExit(f"the save did not pause at {point}")


def resume(out: Path) -> None:
    batch = make_batch()
    result = {}
    for name in ("c0", "ref"):
        model = make_model()
        progress = model.resume_from_checkpoint(str(out / "ckpt" / name))
        result[name] = {"step": progress["step"], "losses": train(model, batch, 2)}
    (out / "resume.json").write_text(json.dumps(result))


if __name__ == "__main__":
    mode, out = sys.argv[1], Path(sys.argv[2])
    save(out, sys.argv[3]) if mode == "save" else resume(out)
