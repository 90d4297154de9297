"""Run under torchrun with 2 processes (CPU, gloo): MegatronModel's ``policy_logps`` and
DecoupledPPOLoss against the one-process TransformersModel on the same seeded weights.

Usage: torchrun --nproc_per_node=2 megatron_scoring.py OUT_DIR LAYOUT [LAYOUT ...], layouts of
``LAYOUTS``. Each layout runs three DecoupledPPOLoss steps as the agentic recipe does: the
proximal logps from ``policy_logps`` just before each update, the behaviour logps fixed (a
stale sampler's: the first step's, shifted), then AdamW. Each rank writes
``OUT_DIR/rank<r>.json`` with, per layout, the figures the test asserts on.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from megatron.core import parallel_state  # noqa: E402
from megatron_parallel import MODEL, features, max_diff  # noqa: E402

from twinkle import DeviceMesh  # noqa: E402
from twinkle.model import MegatronModel, TransformersModel  # noqa: E402

LAYOUTS = {
    "tp2": {"tp_size": 2},
    "cp2": {"cp_size": 2},
    "pp2": {"pp_size": 2},  # TransformersModel refuses pp for its scoring pass
}
ADVANTAGES = [1.0, -0.5, 0.7, -1.2]


def build(model):
    model.set_loss("DecoupledPPOLoss", max_weight=2.0)
    model.set_optimizer("AdamW", lr=1e-3)
    return model


def decoupled_steps(layout: str, feats: list) -> dict:
    mesh = DeviceMesh.from_sizes(device_type="cpu", **LAYOUTS[layout])
    model = build(MegatronModel(MODEL, device_mesh=mesh, device="cpu"))
    reference = build(TransformersModel(MODEL, device="cpu"))
    out = {"prox_diffs": [], "losses": [], "reference_losses": [], "grad_norms": []}
    out["reference_grad_norms"], old = [], None
    for _ in range(3):
        prox, reference_prox = model.policy_logps(feats), reference.policy_logps(feats)
        out["shapes"] = [list(prox.shape), list(reference_prox.shape)]
        out["prox_diffs"].append(max_diff(prox, reference_prox))
        if old is None:  # a stale sampler's logps: the first policy's, shifted per position
            shift = 0.3 * (torch.arange(prox.shape[1]) % 3)
            old = reference_prox - shift
        pending = model._state(None).pending_tokens
        kwargs = {"old_logps": old, "advantages": ADVANTAGES}
        out["losses"].append(model.forward_backward(feats, prox_logps=prox, **kwargs).loss)
        out["scoring_left_no_tokens"] = pending == 0.0
        out["grad_norms"].append(model.clip_grad_and_step(1.0))
        ref = reference.forward_backward(feats, prox_logps=reference_prox, **kwargs)
        out["reference_losses"].append(ref.loss)
        out["reference_grad_norms"].append(reference.clip_grad_and_step(1.0))
    metrics = model.calculate_metric(is_training=True)
    out["is_truncated_fraction"] = metrics["policy/is_truncated_fraction"]
    out["prox_sum"] = float(model.policy_logps(feats).sum())
    if layout == "tp2":
        out["errors"] = {}
        for name, call in (
            ("routing_replay", lambda: model.policy_logps(feats, routing_replay=True)),
            ("no_labels", lambda: model.policy_logps([{"input_ids": [1, 2, 3]}])),
        ):
            try:
                call()
            except ValueError as exc:
                out["errors"][name] = str(exc)
    parallel_state.destroy_model_parallel()
    return out


def main() -> None:
    out_dir, layouts = Path(sys.argv[1]), sys.argv[2:]
    dist.init_process_group("gloo")
    feats = features()
    results = {layout: decoupled_steps(layout, feats) for layout in layouts}
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    # NOTE: as in megatron_parallel, gloo's teardown can abort a rank whose peer closed first.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
