"""Samplers batch several calls of different adapters into one generation: TorchSampler through
peft's mixed-adapter batches, vLLMSampler as one engine call with a LoRA request per prompt
(checked here with a recording engine; tests/gpu/check_vllm_sampler.py and
benchmarks/gpu/bench_sampler_adapters_gpu.py run the real engine)."""

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

from twinkle.data_format import SamplingParams
from twinkle.model.transformers.loading import load_causal_lm
from twinkle.sampler import BASE_MODEL, TorchSampler
from twinkle.sampler.base import SampleRequest
from twinkle.sampler.vllm_io import generate_calls
from twinkle.utils.testing import reduction_tolerance

MODEL_ID = "bundled://tiny-qwen3"
PROMPTS = [
    {"messages": [{"role": "user", "content": "What is 2 + 3?"}]},
    {"messages": [{"role": "user", "content": "Who are you, and who made you?"}]},
]


@pytest.fixture(scope="module")
def sampler():
    sampler = TorchSampler(MODEL_ID, device="cpu")
    sampler.set_template("Qwen3_5Template")
    for seed, (name, rank) in enumerate((("small", 2), ("large", 8), ("attn", 4))):
        donor, _ = load_causal_lm(MODEL_ID, None, None, 0)
        torch.manual_seed(seed)
        targets = ["q_proj", "v_proj"] if name == "attn" else "all-linear"
        lora = LoraConfig(r=rank, target_modules=targets, init_lora_weights=False)
        donor = get_peft_model(donor, lora)
        sampler.load_lora(name, lora.to_dict(), get_peft_model_state_dict(donor))
    return sampler


def _requests() -> list[SampleRequest]:
    params = SamplingParams(max_tokens=6, logprobs=1)
    return [
        SampleRequest(PROMPTS, params.model_copy(update={"seed": 1}), "small", 2),
        SampleRequest(PROMPTS[:1], params.model_copy(update={"seed": 2}), "large", 1),
        SampleRequest(PROMPTS[1:], params.model_copy(update={"seed": 3}), BASE_MODEL, 3),
        SampleRequest(PROMPTS, params.model_copy(update={"seed": 4}), "attn", 1),
        SampleRequest(PROMPTS, params.model_copy(update={"seed": 5, "max_tokens": 3}), "small"),
    ]


def test_calls_of_different_adapters_sampled_together_equal_each_alone(sampler, monkeypatch):
    requests = _requests()
    alone = [sampler.sample_many([r])[0] for r in requests]
    generations = []
    original = sampler._generate_group
    monkeypatch.setattr(
        sampler, "_generate_group", lambda group: generations.append(len(group)) or original(group)
    )
    together = sampler.sample_many(requests)
    # The first four share their params (but their seeds): one generation; the fifth, another.
    assert generations == [4, 1]
    for want, got in zip(alone, together, strict=True):
        assert not isinstance(got, Exception), got
        assert len(got) == len(want)
        for w, g in zip(want, got, strict=True):
            for ws, gs in zip(w.sequences, g.sequences, strict=True):
                assert gs.tokens == ws.tokens and gs.stop_reason == ws.stop_reason
                expected = torch.tensor([lp for (_, lp), *_ in ws.logprobs])
                actual = torch.tensor([lp for (_, lp), *_ in gs.logprobs])
                tol = reduction_tolerance(expected, terms=256)
                torch.testing.assert_close(actual, expected, **tol)


def test_a_refused_call_fails_alone(sampler):
    requests = _requests()[:2]
    requests.insert(1, SampleRequest(PROMPTS, SamplingParams(max_tokens=2), "ghost"))
    outcomes = sampler.sample_many(requests)
    assert isinstance(outcomes[1], ValueError) and "ghost" in str(outcomes[1])
    assert all(not isinstance(o, Exception) for o in (outcomes[0], outcomes[2]))


def test_vllm_calls_run_as_one_batch_with_a_lora_request_per_prompt(fake_vllm, tmp_path):
    from vllm import LLM
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    from twinkle.hub import resolve_model

    engine = LLM(model=str(resolve_model("bundled://tiny-qwen3")))
    seen = []  # the engine's requests when it first steps: every prompt's, at once
    engine.llm_engine.on_step = lambda: seen or seen.extend(engine.llm_engine.requests.values())
    lora_a, lora_b = (LoRARequest(n, i, str(tmp_path)) for i, n in enumerate("ab", 1))
    kwargs = {"n": 1, "max_tokens": 2, "logprobs": 0}
    calls = [
        ([[1, 2], [3]], {**kwargs, "seed": 1}, lora_a, None),
        ([[4]], {**kwargs, "seed": 2}, None, None),
        ([[5, 6, 7], [8], [9]], {**kwargs, "seed": 3}, lora_b, None),
    ]
    per_call = generate_calls(
        engine, calls, lambda kw: SamplingParams(**kw, output_kind=RequestOutputKind.DELTA)
    )
    assert [r.prompt for r in seen] == [[1, 2], [3], [4], [5, 6, 7], [8], [9]]
    assert [r.params.seed for r in seen] == [1, 1, 2, 3, 3, 3]
    assert [r.lora for r in seen] == [lora_a, lora_a, None, lora_b, lora_b, lora_b]
    assert [len(outputs) for outputs in per_call] == [2, 1, 3]
    assert all(len(o.outputs[0].token_ids) == 2 for outputs in per_call for o in outputs)
