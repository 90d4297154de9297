"""``step_with(normalise=False)`` under DDP: the step applies the gradient of the loss summed
over the global batch, as one process does; test_step_with.py runs ``delta`` in-process too.

    torchrun --nproc_per_node=2 step_with_ddp.py OUT

Each data rank back-propagates its own row (the rows have different label counts); with SGD
at lr 1 the weights move by minus that summed gradient. Rank 0 writes OUT/step_with.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig

import twinkle
from twinkle import DeviceMesh
from twinkle.model import TransformersModel

MODEL_ID = "bundled://tiny-qwen3"
ROWS = [
    {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]},
    {"input_ids": [9, 8, 7, 6, 5, 4, 3, 2], "labels": [-100, 8, 7, 6, 5, 4, 3, 2]},
]


def delta(mesh: DeviceMesh | None) -> dict[str, torch.Tensor]:
    """How one ``step_with(normalise=False)`` at lr 1 moves the adapter's weights."""
    torch.manual_seed(0)  # the LoRA init draws from the global generator: same everywhere
    model = TransformersModel(MODEL_ID, device="cpu", device_mesh=mesh)
    model.add_adapter_to_model(
        "default", LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    )
    model.set_optimizer("SGD", lr=0.1)
    named = {n: p for n, p in model.model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in named.items()}
    rows = ROWS if mesh is None else ROWS[mesh.get_slice(len(ROWS))]
    model.forward_backward(rows)
    model.step_with(optimizer_params={"lr": 1.0}, normalise=False)
    return {n: p.detach() - before[n] for n, p in named.items()}


def main(out: Path) -> None:
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    twinkle.initialize("local", global_device_mesh=mesh)
    result = delta(mesh)
    if dist.get_rank() == 0:
        torch.save(result, out / "step_with.pt")
    # NOTE: gloo's C++ teardown can abort a rank ("terminate called without an active
    # exception") when its peer closes the sockets first, even after a barrier. Every rank has
    # written its results, so it leaves without running the destructors.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
