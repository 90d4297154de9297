"""vLLMSampler on a stand-in of vLLM's engine interface (``fake_vllm``, no GPU): its requests
run on the ``LLM``'s ``llm_engine`` step by step, each token heard by the request's
``on_token`` while the engine is still generating, what was heard equal to the sequences it
returns; a prompt the engine refuses fails its call alone, and an engine failure leaves no
request running. (The real engine: ``benchmarks/gpu/check_openai_vllm_gpu.py``.)"""

from __future__ import annotations

import pytest
import torch

from twinkle.data_format import InputFeature, SamplingParams
from twinkle.sampler import vLLMSampler
from twinkle.sampler.base import BASE_MODEL, SampleRequest

MODEL = "bundled://tiny-qwen3"


@pytest.fixture
def sampler(fake_vllm):
    return fake_vllm(vLLMSampler, MODEL, engine_args={"max_model_len": 24}, seed=5)


def _adapter():
    """An adapter's files as the sampler writes them for vLLM (the fake reads no weights)."""
    config = {"peft_type": "LORA", "r": 2, "target_modules": ["q_proj"], "lora_alpha": 4}
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    return config, {name: torch.zeros(2, 64)}


def test_tokens_are_heard_while_the_engine_draws_them_and_add_up_to_the_sequences(sampler):
    engine = sampler.engine.llm_engine
    heard: dict[tuple[int, int], list] = {}

    def listener(call: int):
        def on_token(row, token, pairs):  # the step the engine is on, and what it sent
            heard.setdefault((call, row), []).append((engine.steps, token, pairs))

        return on_token

    config, weights = _adapter()
    sampler.load_lora("mine", config, weights)
    prompts = [InputFeature(input_ids=[3, 4, 5]), InputFeature(input_ids=[6, 7])]
    requests = [
        SampleRequest(prompts, SamplingParams(max_tokens=6, seed=2, logprobs=2), BASE_MODEL, 2),
        SampleRequest(prompts[:1], {"max_tokens": 4, "seed": 3}, "mine", 1, listener(1)),
    ]
    requests[0].on_token = listener(0)
    first, second = sampler.sample_many(requests)
    assert engine.lora_seen[-1].lora_name == "mine" and engine.lora_seen[0] is None
    assert not engine.has_unfinished_requests()
    rows = [(0, r) for r in range(4)] + [(1, 0)]
    assert sorted(heard) == rows
    sequences = [s for response in first for s in response.sequences] + second[0].sequences
    for row, sequence in zip(rows, sequences, strict=True):
        steps, tokens, pairs = zip(*heard[row], strict=True)
        assert list(tokens) == sequence.tokens and list(pairs) == sequence.logprobs
        assert list(steps) == list(range(1, len(tokens) + 1))  # one token a step, as drawn
    assert [len(s.tokens) for s in sequences] == [6, 6, 6, 6, 4]
    assert all(len(pairs) == 3 for s in sequences[:4] for pairs in s.logprobs)
    assert first[0].sequences[0].tokens != first[0].sequences[1].tokens  # samples differ
    expected = sampler._template().tokenizer.decode(sequences[4].tokens, skip_special_tokens=True)
    assert sequences[4].text == expected  # the text, put together from its deltas
    assert sequences[4].new_input_feature.input_ids.tolist() == [3, 4, 5, *sequences[4].tokens]


def test_a_stop_string_is_cut_from_the_text_gathered_from_deltas(sampler):
    params = {"max_tokens": 12, "seed": 4}
    free = sampler.sample([InputFeature(input_ids=[9, 8, 7])], params)[0].sequences[0]
    stop = free.text[4:6]
    cut = sampler.sample([InputFeature(input_ids=[9, 8, 7])], {**params, "stop": stop})
    sequence = cut[0].sequences[0]
    assert sequence.text == free.text[: free.text.find(stop)] and sequence.stop_reason == "stop"


def test_a_prompt_the_engine_refuses_fails_its_call_alone(sampler):
    engine = sampler.engine.llm_engine
    long = InputFeature(input_ids=list(range(10, 40)))  # 30 tokens, max_model_len 24
    requests = [
        SampleRequest([InputFeature(input_ids=[3, 4])], {"max_tokens": 3, "seed": 1}),
        SampleRequest([InputFeature(input_ids=[5]), long], {"max_tokens": 3}),
        SampleRequest([InputFeature(input_ids=[3, 4])], {"max_tokens": 3, "seed": 1}),
        SampleRequest([InputFeature(input_ids=[3])], {"max_tokens": 3}, "nobody"),
    ]
    good, refused, again, unknown = sampler.sample_many(requests)
    assert isinstance(refused, ValueError) and "maximum model length of 24" in str(refused)
    assert isinstance(unknown, ValueError) and "no adapter 'nobody'" in str(unknown)
    assert good[0].sequences[0].tokens == again[0].sequences[0].tokens  # same seed, same draw
    assert len(engine.aborted) == 1  # the refused call's first prompt, added before the second
    assert not engine.has_unfinished_requests()


def test_an_engine_failure_aborts_every_request_it_was_running(sampler):
    engine = sampler.engine.llm_engine

    def broken():
        if engine.steps == 2:
            raise RuntimeError("the engine died")

    engine.on_step = broken
    prompts = [InputFeature(input_ids=[3, 4]), InputFeature(input_ids=[5, 6])]
    with pytest.raises(RuntimeError, match="the engine died"):
        sampler.sample(prompts, {"max_tokens": 5}, num_samples=2)
    assert len(engine.aborted) == 2 and not engine.has_unfinished_requests()


def test_vocab_size_is_the_engines(sampler):
    assert sampler.vocab_size() == sampler.engine.llm_engine.model_config.get_vocab_size() > 1000
