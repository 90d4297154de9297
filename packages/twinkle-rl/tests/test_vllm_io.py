"""vLLMSampler without vLLM: the request and response conversions on objects shaped like
vLLM's RequestOutput, and a clear error at construction where vLLM or a GPU is missing."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from twinkle.data_format import InputFeature, SamplingParams
from twinkle.sampler import vLLMSampler
from twinkle.sampler.vllm_io import (
    to_sample_response,
    top_logprobs,
    vllm_prompts,
    vllm_sampling_kwargs,
)


def logprob(value, rank):
    return SimpleNamespace(logprob=value, rank=rank, decoded_token=None)


def test_sampling_kwargs_split_string_and_token_stops_and_always_ask_for_logprobs():
    params = SamplingParams(max_tokens=9, temperature=0.7, top_p=0.9, top_k=5, seed=3, stop=[7, 8])
    kwargs = vllm_sampling_kwargs(params, stop_token_ids=[2])
    assert kwargs["stop"] is None and kwargs["stop_token_ids"] == [2, 7, 8]
    assert kwargs["logprobs"] == 0  # the sampled token's logprob, which training needs
    assert (kwargs["n"], kwargs["max_tokens"], kwargs["top_k"], kwargs["seed"]) == (1, 9, 5, 3)
    strings = vllm_sampling_kwargs(SamplingParams(max_tokens=1, stop="END", logprobs=3))
    assert strings["stop"] == ["END"] and strings["logprobs"] == 3
    assert strings["include_stop_str_in_output"] is False


def test_prompts_are_token_prompts():
    assert vllm_prompts([np.array([1, 2]).tolist(), [3]]) == [
        {"prompt_token_ids": [1, 2]},
        {"prompt_token_ids": [3]},
    ]


def test_a_position_puts_the_sampled_token_first_then_the_best_by_rank():
    position = {5: logprob(-2.0, 3), 9: logprob(-0.5, 1), 4: logprob(-1.0, 2)}
    assert top_logprobs(5, position, top=2) == [(5, -2.0), (9, -0.5), (4, -1.0)]
    assert top_logprobs(5, position, top=0) == [(5, -2.0)]
    with pytest.raises(ValueError, match="sampled token 6"):
        top_logprobs(6, position, top=0)


def test_a_request_output_becomes_a_sample_response_ready_for_training():
    prompt = InputFeature(
        input_ids=[1, 2, 3],
        messages=[{"role": "user", "content": "2+2?"}],
        user_data=[{"answer": "4"}],
    )
    completion = SimpleNamespace(
        token_ids=[11, 12],
        text="#### 4",
        finish_reason="stop",
        logprobs=[{11: logprob(-0.1, 1)}, {12: logprob(-0.7, 2), 13: logprob(-0.2, 1)}],
    )
    output = SimpleNamespace(
        outputs=[completion],
        prompt_logprobs=[None, {2: logprob(-3.0, 4)}, {3: logprob(-1.5, 1)}],
    )
    params = SamplingParams(max_tokens=4, logprobs=1, prompt_logprobs=0)
    response = to_sample_response(output, prompt, [1, 2, 3], params)
    seq = response.sequences[0]
    assert seq.tokens == [11, 12] and seq.stop_reason == "stop" and seq.text == "#### 4"
    assert seq.logprobs == [[(11, -0.1), (11, -0.1)], [(12, -0.7), (13, -0.2)]]
    assert response.prompt_logprobs == [None, [(2, -3.0)], [(3, -1.5)]]
    feature = seq.new_input_feature
    assert feature.input_ids.tolist() == [1, 2, 3, 11, 12]
    assert feature.labels.tolist() == [-100, -100, -100, 11, 12]
    assert feature.messages[-1].content == "#### 4" and feature.user_data == [{"answer": "4"}]


def test_missing_logprobs_are_refused():
    completion = SimpleNamespace(token_ids=[1], text="", finish_reason="length", logprobs=None)
    output = SimpleNamespace(outputs=[completion], prompt_logprobs=None)
    with pytest.raises(ValueError, match="logprobs >= 0"):
        to_sample_response(output, InputFeature(input_ids=[1]), [1], SamplingParams(max_tokens=1))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_construction_without_vllm_or_gpu_says_what_to_use():
    with pytest.raises((ImportError, RuntimeError), match="TorchSampler"):
        vLLMSampler(model_id="bundled://tiny-qwen3", engine_args={"gpu_memory_utilization": 0.5})


def test_ignore_eos_keeps_only_the_requested_stops():
    params = SamplingParams(max_tokens=4, stop=[7], ignore_eos=True)
    kwargs = vllm_sampling_kwargs(params, stop_token_ids=[2])
    assert kwargs["stop_token_ids"] == [7] and kwargs["ignore_eos"] is True
    assert vllm_sampling_kwargs(SamplingParams(max_tokens=4), [2])["ignore_eos"] is False
