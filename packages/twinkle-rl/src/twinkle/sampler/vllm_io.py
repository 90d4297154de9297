"""The engine-free half of vLLMSampler: SamplingParams and prompt features in the shape vLLM's
``LLM.generate`` takes, and vLLM's ``RequestOutput`` back as SampleResponses.

Plain functions over duck-typed objects (vLLM's ``RequestOutput``, ``CompletionOutput`` and
``Logprob`` by their attribute names), so they run and are tested without vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.data_format import InputFeature, SampleResponse, SamplingParams, TopLogprobs
from twinkle.sampler.prompts import sampled_sequence

_FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "abort", None: "abort"}


def vllm_sampling_kwargs(params: SamplingParams, stop_token_ids: Sequence[int] = ()) -> dict:
    """Keyword arguments for ``vllm.SamplingParams``. ``logprobs`` is at least 0, so vLLM
    always returns the sampled token's logprob (the training loop needs it); token-id stops
    go to ``stop_token_ids``, string stops to ``stop``; stop strings are cut from the text
    as TorchSampler does. vLLM's logprobs are its raw model logprobs (before temperature and
    filters), the same quantity TorchSampler reports. ``ignore_eos`` drops the end-of-turn
    ``stop_token_ids`` as well as vLLM's own EOS stop."""
    stop = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
    end_of_turn = () if params.ignore_eos else stop_token_ids
    kwargs: dict[str, Any] = {
        "n": params.num_samples,
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "seed": params.seed,
        "stop": [s for s in stop if isinstance(s, str)] or None,
        "stop_token_ids": sorted({*end_of_turn, *(s for s in stop if isinstance(s, int))}),
        "logprobs": params.logprobs or 0,
        "prompt_logprobs": params.prompt_logprobs,
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
        "ignore_eos": params.ignore_eos,
    }
    return kwargs


def vllm_prompts(prompt_ids: Sequence[Sequence[int]]) -> list[dict[str, list[int]]]:
    """Token prompts, so vLLM runs exactly the tokens the template produced."""
    return [{"prompt_token_ids": list(ids)} for ids in prompt_ids]


def top_logprobs(token: int, position: Mapping[int, Any], top: int) -> TopLogprobs:
    """vLLM's ``{token_id: Logprob(logprob, rank, ...)}`` for one position as TorchSampler's
    list: the sampled token first, then the ``top`` best by rank."""
    if token not in position:
        raise ValueError(f"vLLM returned no logprob for the sampled token {token}")
    best = sorted(
        ((tid, lp) for tid, lp in position.items() if lp.rank is not None and lp.rank <= top),
        key=lambda item: item[1].rank,
    )
    return [(token, float(position[token].logprob))] + [(t, float(lp.logprob)) for t, lp in best]


def _prompt_logprobs(output: Any, prompt_ids: Sequence[int], top: int | None):
    entries = getattr(output, "prompt_logprobs", None)
    if top is None or entries is None:
        return None
    return [
        None if position is None else top_logprobs(token, position, top)
        for token, position in zip(prompt_ids, entries, strict=True)
    ]


def to_sample_response(
    output: Any, prompt: InputFeature, prompt_ids: Sequence[int], params: SamplingParams
) -> SampleResponse:
    """One vLLM ``RequestOutput`` as a SampleResponse with ``new_input_feature``s."""
    top = params.logprobs or 0
    sequences = []
    for completion in output.outputs:
        tokens = list(completion.token_ids)
        positions = completion.logprobs or []
        if len(positions) != len(tokens):
            raise ValueError(
                f"vLLM returned {len(positions)} logprob entries for {len(tokens)} tokens; "
                "sample with logprobs >= 0"
            )
        logprobs = [top_logprobs(t, p, top) for t, p in zip(tokens, positions, strict=True)]
        reason = _FINISH_REASONS.get(completion.finish_reason, "abort")
        sequences.append(
            sampled_sequence(prompt, prompt_ids, tokens, logprobs, reason, completion.text)
        )
    return SampleResponse(
        sequences=sequences,
        prompt_logprobs=_prompt_logprobs(output, prompt_ids, params.prompt_logprobs),
    )


def generate_calls(
    engine: Any,
    calls: Sequence[tuple[Sequence[Sequence[int]], Any, Any]],
    make_params: Any,
) -> list[list[Any]]:
    """Several sample calls as one ``engine.generate``: each call's ``(prompt ids,
    vllm_sampling_kwargs, LoRARequest or None)`` spread over its prompts, so vLLM batches
    the prompts of every adapter together (its multi-LoRA scheduling) with each prompt's own
    params and seed; returns each call's RequestOutputs, in order. ``make_params`` builds a
    ``vllm.SamplingParams`` from the keyword arguments."""
    prompts, params, loras = [], [], []
    for prompt_ids, kwargs, lora in calls:
        built = make_params(kwargs)
        prompts += vllm_prompts(prompt_ids)
        params += [built] * len(prompt_ids)
        loras += [lora] * len(prompt_ids)
    outputs = list(engine.generate(prompts, params, lora_request=loras, use_tqdm=False))
    if len(outputs) != len(prompts):
        raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
    per_call, start = [], 0
    for prompt_ids, _, _ in calls:
        per_call.append(outputs[start : start + len(prompt_ids)])
        start += len(prompt_ids)
    return per_call
