"""Train, save and resume the bundled tiny model; test_checkpoint_resume runs it in new processes.

    python resume_run.py train OUT    # per kind: N steps without a break; then, afresh,
                                      # K steps, save, and on to N in the same process
    python resume_run.py resume OUT   # per kind: resume from the step-K checkpoint, N-K steps

Kinds: 'lora' (LoRA with dropout, so the torch RNG matters) and 'full'. Batches come
from a shuffled DataLoader over 16 rows in batches of 4, so the run crosses an epoch.
Each step also draws from Python's and numpy's global generators and records the
draws, which checks that their states are restored too. Results go to
OUT/<mode>.json.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig

from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor

N, K, BATCH = 6, 3, 4
KINDS = ("lora", "full")
BASE = "bundled://tiny-qwen3"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_loader() -> DataLoader:
    dataset = Dataset(DatasetMeta("bundled://self-cognition", data_slice=range(16)))
    dataset.set_template("Qwen3_5Template", model_id=BASE, max_length=256)
    dataset.map(SelfCognitionProcessor("twinkle", "ModelScope"))
    dataset.encode()
    return DataLoader(dataset, batch_size=BATCH, shuffle=True)


def make_model(kind: str, model_id: str = BASE) -> TransformersModel:
    """The set-up every run (and every resumed run) does, in the documents' order."""
    model = TransformersModel(model_id, device="cpu")
    if kind == "lora":
        config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear")
        model.add_adapter_to_model("default", config)
    model.set_optimizer("AdamW", lr=1e-3 if kind == "full" else 1e-2)
    model.set_lr_scheduler("CosineWarmupScheduler", num_warmup_steps=2, num_training_steps=N)
    return model


def batches(loader: DataLoader) -> Iterator:
    while True:  # each `for` over the loader is one epoch; go on into the next
        yield from loader


def train_step(model: TransformersModel, batch: list, log: dict) -> None:
    log["losses"].append(model.forward_backward(inputs=batch).loss)
    model.clip_grad_and_step()
    log["draws"].append([random.random(), float(np.random.rand())])


def digest(model: TransformersModel) -> str:
    """A fingerprint of the trainable weights, equal only when every bit is."""
    sha = hashlib.sha256()
    for name, param in sorted(model.model.named_parameters()):
        if param.requires_grad:
            sha.update(name.encode())
            sha.update(param.detach().cpu().numpy().tobytes())
    return sha.hexdigest()


def train(out: Path) -> dict:
    results = {}
    for kind in KINDS:
        seed_everything(0)
        loader, model = make_loader(), make_model(kind)
        reference = {"losses": [], "draws": []}
        stream = batches(loader)
        for _ in range(N):
            train_step(model, next(stream), reference)
        reference["digest"] = digest(model)

        seed_everything(0)
        loader, model = make_loader(), make_model(kind)
        continued = {"losses": [], "draws": []}
        stream = batches(loader)
        for _ in range(K):
            train_step(model, next(stream), continued)
        consumed = loader.get_state()["consumed_train_samples"]
        path = model.save(f"step-{K}", output_dir=out / kind, consumed_train_samples=consumed)
        for _ in range(N - K):
            train_step(model, next(stream), continued)
        continued["digest"] = digest(model)
        results[kind] = {"reference": reference, "continued": continued, "checkpoint": path}
    return results


def resume(out: Path) -> dict:
    results = {}
    for kind in KINDS:
        seed_everything(1234)  # a different seed: only the restored states can match
        checkpoint = str(out / kind / f"step-{K}")
        loader = make_loader()
        model = make_model(kind, model_id=checkpoint if kind == "full" else BASE)
        progress = model.resume_from_checkpoint(checkpoint)
        loader.resume_from_checkpoint(progress["consumed_train_samples"])
        resumed = {"losses": [], "draws": [], "progress": progress}
        stream = batches(loader)
        for _ in range(N - K):
            train_step(model, next(stream), resumed)
        resumed["digest"] = digest(model)
        results[kind] = resumed
    return results


def main() -> None:
    mode, out = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    results = {"train": train, "resume": resume}[mode](out)
    (out / f"{mode}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
