"""Run under torchrun with 2 processes (CPU, gloo): MegatronModel on the bundled tiny families
beyond Qwen3, against the one-process TransformersModel on the same seeded weights.

Usage: torchrun --nproc_per_node=2 megatron_families.py OUT_DIR CASE [CASE ...], where a CASE
is ``<bundled name>:<layout>`` with a layout of ``LAYOUTS`` (``tiny-phi4:tp2``, say), or
``<bundled name>+bias:<layout>``: the same weights saved to a folder with the routers'
load-balancing bias (``e_score_correction_bias``, zero at init) drawn at random, so that it
changes which experts are chosen. Each case encodes four conversations with the family's own
chat template (the generic ``Template``), compares logits, logps and the weights' round trip
and export, then three AdamW steps (``megatron_parallel.equivalence``).
``lora_peft:<bundled name>@<layout>`` trains LoRA on all linears against peft
(``megatron_parallel.lora_case``); ``lora_refused:<bundled name>`` records the error of LoRA
on a family whose MegatronRules refuse it.

Each rank writes ``OUT_DIR/rank<r>.json`` with, per case, the figures the test asserts on.
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
from megatron_parallel import SIZES, equivalence  # noqa: E402

from twinkle import DeviceMesh  # noqa: E402
from twinkle.model import MegatronModel, TransformersModel  # noqa: E402
from twinkle.template import Template  # noqa: E402

LAYOUTS = {
    "tp2": {"tp_size": 2},
    "dp2": {"dp_size": 2},
    "ep2": {"dp_size": 2, "ep_size": 2},
    "tp2sp": {"tp_size": 2, "sequence_parallel": True},
    "pp2": {"pp_size": 2},
}


def family_features(model_id: str) -> list:
    template = Template(model_id, max_length=64)
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"what is {i} plus {i}?"},
                {"role": "assistant", "content": f"it is {2 * i}, of course. " * (1 + i % 3)},
            ]
        }
        for i in range(4)
    ]
    return [template.encode(row) for row in rows]


def with_random_router_bias(model_id: str, root: Path) -> Path:
    folder = root / (model_id.rsplit("/", 1)[-1] + "+bias")
    if dist.get_rank() == 0 and not folder.exists():
        model = TransformersModel(model_id, device="cpu").model
        generator = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buffer.copy_(0.3 * torch.randn(buffer.shape, generator=generator))
        model.save_pretrained(folder)
    dist.barrier()
    return folder


def lora_trains_like_peft(name: str, root: Path, layout: str) -> dict:
    """LoRA on all linears under ``layout`` against peft on the Hugging Face model: peft's
    rewrite for an MoE model adapts the attention, the fused experts and the router."""
    from megatron_parallel import lora_case
    from transformers import AutoConfig

    from twinkle.hub import resolve_model

    config = AutoConfig.from_pretrained(resolve_model(f"bundled://{name}"))
    feats = family_features(f"bundled://{name}")
    return lora_case(feats, root / f"lora_{name}", LAYOUTS[layout], config)


def lora_refused(model_id: str) -> str | None:
    from peft import LoraConfig

    mesh = DeviceMesh.from_sizes(device_type="cpu", dp_size=2)
    model = MegatronModel(model_id, device_mesh=mesh, device="cpu")
    try:
        model.add_adapter_to_model("default", LoraConfig(r=2, target_modules="all-linear"))
    except ValueError as exc:
        return str(exc)
    return None


def main() -> None:
    out_dir, cases = Path(sys.argv[1]), sys.argv[2:]
    dist.init_process_group("gloo")
    results = {}
    for case in cases:
        head, tail = case.split(":")
        if head == "lora_refused":
            results[case] = lora_refused(f"bundled://{tail}")
        elif head.startswith("lora_"):
            name, layout = tail.rsplit("@", 1)
            results[case] = lora_trains_like_peft(name, out_dir, layout)
        else:
            name, _, bias = head.partition("+")
            bundled = f"bundled://{name}"
            model_id = str(with_random_router_bias(bundled, out_dir)) if bias else bundled
            SIZES[case] = LAYOUTS[tail]
            results[case] = equivalence(case, family_features(bundled), model_id=model_id)
        parallel_state.destroy_model_parallel()
    (out_dir / f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    # NOTE: as in megatron_extras, gloo's teardown can abort a rank whose peer closed first.
    dist.barrier()
    os._exit(0)


if __name__ == "__main__":
    main()
