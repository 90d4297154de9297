"""The algorithm catalogue's losses under DDP against one process, run by test_losses_ddp:

    torchrun --nproc_per_node=2 losses_ddp.py OUT

For each loss, every rank builds the same tiny-qwen3 twice (same init): a reference trained
in this process on the whole batch, and a DDP copy (dp=2) that trains on its half. The four
rows have 8, 5, 7 and 3 label tokens, so the ranks hold 13 and 10: a loss normalised by its
rank's own tokens would differ from one process. One SGD step (lr 1, no clipping): the
gradient norms and the largest weight difference afterwards are recorded. Policy losses get
old logps a little off the model's own (so ratios leave 1 and some clip) and per-sequence
advantages (decoupled PPO also proximal logps half way between); GKD gets random teacher
logits; the value loss trains a TransformersValueModel on returns and old values; the
preference losses take (chosen, rejected) row pairs.
BNPO normalises by the tokens of each batch a loss call sees, which under DDP is a rank's
share (TRL's local batch): its one-process reference runs the shares as micro-batches.
Results go to OUT/rank<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from twinkle.mesh import DeviceMesh
from twinkle.model import TransformersModel, TransformersValueModel

MODEL_ID = "bundled://tiny-qwen3"
LENGTH, PROMPTS = 11, (3, 6, 4, 8)  # label tokens per row: 8, 5, 7, 3
POLICY = {
    "PPOLoss": {"epsilon": 0.1, "dual_clip": 3.0},
    "SAPOLoss": {},
    "BNPOLoss": {"epsilon": 0.1},
    "DRGRPOLoss": {"epsilon": 0.1, "max_completion_length": 10},
    "GRPOLoss": {"epsilon": 0.1, "beta": 0.1},
    "DecoupledPPOLoss": {"epsilon": 0.1, "max_weight": 1.2},
}
PREFERENCE = {"SimPOLoss": {}, "CPOLoss": {}, "ORPOLoss": {}}


def rows() -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    out = []
    for prompt in PROMPTS:
        ids = torch.randint(1, 3000, (LENGTH,), generator=generator).tolist()
        out.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return out


def loss_inputs(vocab: int) -> dict[str, dict]:
    """Each loss's keyword arguments for the whole batch, (B, ...) tensors cut by rows."""
    generator = torch.Generator().manual_seed(1)
    reference = TransformersModel(MODEL_ID, device="cpu")
    logps = reference.forward_only(rows()).logps
    old = logps + 0.2 * torch.randn(logps.shape, generator=generator)
    advantages = torch.tensor([1.0, -0.5, 0.8, -1.2])
    ref_logps = logps - 0.1 * torch.randn(logps.shape, generator=generator).abs()
    policy = {"old_logps": old, "advantages": advantages}
    inputs = {name: dict(policy) for name in POLICY}
    inputs["GRPOLoss"]["ref_logps"] = ref_logps
    # The proximal policy between the sampler's and the model's: weights leave 1, some truncate.
    inputs["DecoupledPPOLoss"]["prox_logps"] = (logps + old) / 2
    inputs["GKDLoss"] = {"teacher_logits": torch.randn((4, LENGTH, vocab), generator=generator)}
    returns = torch.randn(logps.shape, generator=generator)
    inputs["PPOValueLoss"] = {"returns": returns, "old_values": 0.3 * returns}
    for name in PREFERENCE:
        inputs[name] = {}
    return inputs


def cut(kwargs: dict, share: slice) -> dict:
    return {k: v[share] for k, v in kwargs.items()}


def one_step(
    name: str, options: dict, kwargs: dict, mesh: DeviceMesh | None, micro: int | None = None
) -> dict:
    torch.manual_seed(0)
    cls = TransformersValueModel if name == "PPOValueLoss" else TransformersModel
    model = cls(MODEL_ID, device="cpu", device_mesh=mesh, seed=0)
    model.set_loss(name, **options)
    model.set_optimizer("SGD", lr=1.0)
    before = {n: p.detach().clone() for n, p in model.model.named_parameters()}
    batch = rows()
    share = slice(None) if mesh is None else mesh.get_slice(len(batch))
    model.forward_backward(batch[share], micro_batch_size=micro, **cut(kwargs, share))
    norm = model.clip_grad_and_step(1e9)
    delta = {n: p.detach() - before[n] for n, p in model.model.named_parameters()}
    return {"norm": float(norm), "delta": delta}


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    mesh = DeviceMesh.from_sizes(dp_size=2, device_type="cpu")
    vocab = TransformersModel(MODEL_ID, device="cpu").model.config.vocab_size
    inputs = loss_inputs(vocab)
    options = {**POLICY, **PREFERENCE, "GKDLoss": {"beta": 0.5}, "PPOValueLoss": {}}
    result = {}
    for name, kwargs in inputs.items():
        # BNPO normalises each batch a loss call sees: under DDP a rank's share, so one
        # process matches it with the shares as micro-batches (the whole batch differs).
        micro = 2 if name == "BNPOLoss" else None
        single = one_step(name, options[name], kwargs, None, micro)
        ddp = one_step(name, options[name], kwargs, mesh)
        worst = max(float((ddp["delta"][n] - d).abs().max()) for n, d in single["delta"].items())
        scale = max(float(d.abs().max()) for d in single["delta"].values())
        result[name] = {"norm_single": single["norm"], "norm_ddp": ddp["norm"]}
        result[name].update(max_delta_diff=worst, max_delta=scale)
    whole = one_step("BNPOLoss", POLICY["BNPOLoss"], inputs["BNPOLoss"], None)
    result["BNPOLoss"]["norm_whole"] = whole["norm"]
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.barrier()
    os._exit(0)  # see ep_equivalence.py: gloo's teardown can abort a rank after its peer left


if __name__ == "__main__":
    main(Path(sys.argv[1]))
