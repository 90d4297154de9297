"""Tenants batched on one CUDA GPU: training passes and multi-LoRA sampling (issue 19 item 1).

Not run by CI: it needs a CUDA GPU (and, for the vLLM part, vLLM in its own environment). It
checks on the device what the CPU tests check up to it, and measures what the 2-core CPU
benchmark (``bench_server.py``) cannot: whether one pass of many tenants' small requests
beats running them one after another where a call is latency-bound.

1. Training: a Qwen3-0.6B-shaped model (random init), ``--tenants`` LoRA adapters (ranks
   4 to 32, different targets), each tenant a batch of 4 x 256 tokens. Serial
   ``forward_backward`` per tenant against one ``forward_backward_many``; prints training
   tokens/s of both and checks every tenant's loss and gradients agree (bf16 autocast, so
   the check is loose: 1e-2 relative).
2. Sampling, TorchSampler on CUDA: ``--tenants`` adapters, one ``sample`` call each against
   ``sample_many`` of all (peft's mixed-adapter batches); same tokens at temperature 0.
3. Sampling, vLLMSampler (skipped, saying so, when vLLM is not installed): the same calls
   as requests of one engine, stepped together, with a LoRARequest per prompt (vLLM's
   multi-LoRA batching) against one call per adapter.

    python benchmarks/gpu/bench_tenants_gpu.py [--tenants 8] [--steps 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time

import torch

QWEN3_06B = dict(
    vocab_size=151_936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
)
TARGETS = ["all-linear", ["q_proj", "v_proj"], ["gate_proj", "up_proj", "down_proj"]]


def lora(i: int):
    from peft import LoraConfig

    return LoraConfig(
        r=4 * 2 ** (i % 4), lora_alpha=16, target_modules=TARGETS[i % 3], init_lora_weights=False
    )


def tiny_folder() -> str:
    """A Qwen3-0.6B-shaped model saved with random weights (no hub on the device)."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from twinkle.hub import resolve_model

    folder = tempfile.mkdtemp(prefix="qwen3-0.6b-random-")
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_06B)).to(torch.bfloat16)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(resolve_model("bundled://tiny-qwen3"))).save_pretrained(
        folder
    )
    return folder


def timed(fn, steps: int) -> float:
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def training(folder: str, tenants: int, steps: int) -> None:
    from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel
    from twinkle.model.transformers.tenant_pass import TenantRequest

    model = MultiLoraTransformersModel(folder, max_loras=tenants, max_rank=32, device="cuda")
    names = [f"t{i}" for i in range(tenants)]
    for i, name in enumerate(names):
        model.add_adapter_to_model(name, lora(i))
        model.set_optimizer("AdamW", lr=1e-4, adapter_name=name)
    generator = torch.Generator().manual_seed(0)
    requests = []
    for name in names:
        ids = torch.randint(1, 150_000, (4, 256), generator=generator).tolist()
        requests.append(TenantRequest(name, [{"input_ids": r, "labels": r} for r in ids]))

    def serial():
        return [model.forward_backward(r.inputs, adapter_name=r.adapter_name) for r in requests]

    def grads(name):
        params = model.model.named_parameters()
        return [
            p.grad.float().clone() for k, p in params if f".{name}." in k and p.grad is not None
        ]

    def zero():
        for name in names:
            model.zero_grad(adapter_name=name)

    alone = serial()
    grads_alone = {name: grads(name) for name in names}
    zero()
    together = model.forward_backward_many(requests)
    for name, a, b in zip(names, alone, together, strict=True):
        assert not isinstance(b, Exception), b
        assert abs(a.loss - b.loss) <= 1e-2 * abs(a.loss), (name, a.loss, b.loss)
        for ga, gb in zip(grads_alone[name], grads(name), strict=True):
            assert torch.allclose(ga, gb, rtol=1e-2, atol=1e-2 * ga.abs().max().item()), name
    zero()
    t_serial = timed(lambda: (serial(), zero()), steps)
    t_batched = timed(lambda: (model.forward_backward_many(requests), zero()), steps)
    tokens = tenants * 4 * 256
    print(
        f"training, {tenants} tenants x 4 x 256 tokens: serial {tokens / t_serial:,.0f} tok/s, "
        f"batched {tokens / t_batched:,.0f} tok/s ({t_serial / t_batched:.2f}x); "
        "losses and gradients agree"
    )


def sampling(sampler, tenants: int, steps: int, what: str) -> None:
    from twinkle.data_format import SamplingParams
    from twinkle.sampler.base import SampleRequest

    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    prompts = [{"messages": [{"role": "user", "content": f"Count to {i}."}]} for i in range(4)]
    requests = [SampleRequest(prompts, params, f"t{i}", 1) for i in range(tenants)]
    alone = [sampler.sample_many([r])[0] for r in requests]
    together = sampler.sample_many(requests)
    for a, b in zip(alone, together, strict=True):
        assert [s.tokens for r in a for s in r.sequences] == [
            s.tokens for r in b for s in r.sequences
        ], what
    t_alone = timed(lambda: [sampler.sample_many([r]) for r in requests], steps)
    t_together = timed(lambda: sampler.sample_many(requests), steps)
    tokens = tenants * len(prompts) * 64
    print(
        f"{what}, {tenants} adapters x 4 prompts x 64 tokens: one at a time "
        f"{tokens / t_alone:,.0f} tok/s, one batch {tokens / t_together:,.0f} tok/s "
        f"({t_alone / t_together:.2f}x); greedy tokens agree"
    )


def load_adapters(sampler, folder: str, tenants: int) -> None:
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    for i in range(tenants):
        donor = AutoModelForCausalLM.from_pretrained(folder)
        torch.manual_seed(i)
        donor = get_peft_model(donor, lora(i))
        sampler.load_lora(f"t{i}", lora(i).to_dict(), get_peft_model_state_dict(donor))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tenants", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_tenants_gpu.py needs a CUDA GPU; this machine has none")
    folder = tiny_folder()
    training(folder, args.tenants, args.steps)
    torch.cuda.empty_cache()
    from twinkle.sampler import TorchSampler

    sampler = TorchSampler(folder, device="cuda")
    sampler.set_template("Qwen3_5Template")
    load_adapters(sampler, folder, args.tenants)
    sampling(sampler, args.tenants, args.steps, "TorchSampler")
    del sampler
    torch.cuda.empty_cache()
    if importlib.util.find_spec("vllm") is None:
        print("vLLMSampler: skipped, vLLM is not installed in this environment")
        return
    from twinkle.sampler import vLLMSampler

    engine_args = {"enable_lora": True, "max_loras": args.tenants, "max_lora_rank": 32}
    sampler = vLLMSampler(folder, engine_args=engine_args)
    sampler.set_template("Qwen3_5Template")
    load_adapters(sampler, folder, args.tenants)
    sampling(sampler, args.tenants, args.steps, "vLLMSampler")


if __name__ == "__main__":
    main()
