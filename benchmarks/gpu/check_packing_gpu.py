"""Padding-free by default and compile=True on one CUDA GPU: the checks a CPU cannot make.

For each attention implementation available (sdpa, and flash_attention_2 when flash-attn
is installed), the ~50M Qwen3 of bench_model_packing.py in bf16 autocast trains the
documents' loop on skewed rows (log-normal lengths, median 256, up to 2048) with the
model choosing the layout, and the
same rows padded (``padding_free=False``): the first losses must agree to 1e-3 relative
(bf16), the model must have run packed, and the table shows tokens/s of both. Then
``compile=True`` (inductor) against eager on the packed side: equal first loss and
tokens/s after compilation. The CPU tests cover everything up to the device
(``packages/twinkle-models/tests/test_padding_free_default.py``, ``test_compile.py``).

    python benchmarks/gpu/check_packing_gpu.py [--steps 10]

Refuses to run without a CUDA GPU. About three minutes on an H100/H200.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_model_packing import model_config  # noqa: E402


def skewed_rows(count: int, vocab: int) -> list[dict]:
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(256), 1.0, count).astype(int), 16, 2048)
    return [
        {"input_ids": ids, "labels": ids}
        for ids in (rng.integers(1, vocab, n).tolist() for n in lengths)
    ]


def train(config, rows, steps, padding_free, compile=False) -> tuple[float, float, bool]:
    from twinkle.model import TransformersModel
    from twinkle.processor import InputProcessor

    model = TransformersModel(config=config, compile=compile)
    model.set_processor(InputProcessor, padding_free=padding_free)
    model.set_optimizer("AdamW", lr=1e-4)
    shapes = []
    model._hf_model().get_input_embeddings().register_forward_hook(
        lambda m, args, out: shapes.append(args[0].shape[0])
    )
    batches = [rows[i : i + 8] for i in range(0, len(rows), 8)]
    first = model.forward_backward(inputs=batches[0]).loss  # warm-up (and compilation)
    model.clip_grad_and_step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for batch in batches[1 : steps + 1]:
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
    torch.cuda.synchronize()
    tokens = sum(len(r["input_ids"]) for b in batches[1 : steps + 1] for r in b)
    return first, tokens / (time.perf_counter() - start), shapes[0] == 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("check_packing_gpu.py needs a CUDA GPU")
    implementations = ["sdpa"]
    if importlib.util.find_spec("flash_attn") is not None:
        implementations.append("flash_attention_2")
    rows = skewed_rows(8 * (args.steps + 1), model_config("50m").vocab_size)
    print(f"{torch.cuda.get_device_name()} · torch {torch.__version__}\n")
    print("| attention | padded tok/s | padding-free tok/s | ratio | packed | loss agrees |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for implementation in implementations:
        config = model_config("50m")
        config._attn_implementation = implementation
        padded = train(config, rows, args.steps, padding_free=False)
        packed = train(config, rows, args.steps, padding_free=None)
        agrees = abs(packed[0] - padded[0]) <= 1e-3 * abs(padded[0])
        print(
            f"| {implementation} | {padded[1]:,.0f} | {packed[1]:,.0f} | "
            f"{packed[1] / padded[1]:.2f}x | {packed[2]} | {agrees} |",
            flush=True,
        )
        if implementation == implementations[-1]:
            compiled = train(config, rows, args.steps, padding_free=None, compile=True)
            same = abs(compiled[0] - packed[0]) <= 1e-3 * abs(packed[0])
            print(
                f"\ncompile=True ({implementation}): {compiled[1]:,.0f} tok/s, "
                f"{compiled[1] / packed[1]:.2f}x eager; first loss agrees: {same}"
            )


if __name__ == "__main__":
    main()
