"""The engine-side half of vLLMSampler: SamplingParams and prompt features in the shape vLLM's
engine takes, its requests driven step by step (tokens heard as they are drawn), and vLLM's
``RequestOutput`` back as SampleResponses.

Plain functions over duck-typed objects (vLLM's ``LLMEngine``, ``RequestOutput``,
``CompletionOutput`` and ``Logprob`` by their attribute names), so they run and are tested
without vLLM (``tests/fake_vllm`` is a stand-in of that interface).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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


@dataclass
class Completion:
    """One completion put together from vLLM's DELTA outputs: the ``CompletionOutput``
    fields ``to_sample_response`` reads, each the concatenation of its deltas."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[Any] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None


@dataclass
class Gathered:
    """One prompt's ``RequestOutput``, put together from its deltas."""

    outputs: list[Completion]
    prompt_logprobs: Any = None

    @property
    def done(self) -> bool:
        return all(c.finish_reason is not None for c in self.outputs)


TokenListener = Callable[[int, int, TopLogprobs], None]
Call = tuple[Sequence[Sequence[int]], Mapping[str, Any], Any, "TokenListener | None"]
_request_numbers = itertools.count()


def generate_calls(
    engine: Any, calls: Sequence[Call], make_params: Callable[[Mapping[str, Any]], Any]
) -> list[list[Gathered] | Exception]:
    """Several sample calls run together on the engine, token by token: each call's
    ``(prompt ids, vllm_sampling_kwargs, LoRARequest or None, on_token or None)`` spread over
    its prompts as requests of the ``LLM``'s ``llm_engine`` (``add_request``, then ``step``
    until they finish), so vLLM batches the prompts of every adapter together (its
    multi-LoRA scheduling) with each prompt's own params and seed. ``make_params`` builds a
    ``vllm.SamplingParams`` whose ``output_kind`` is DELTA from the keyword arguments: each
    step hands over only the new tokens, which go to the call's ``on_token`` as ``(row, token,
    logprob pairs)`` (rows prompt by prompt, ``n`` each) while the rest is being generated.
    Returns each call's outputs per prompt, or the exception that refused that call alone (a
    prompt vLLM would not take, an output without logprobs); the engine failing fails all."""
    llm = engine.llm_engine
    results: list[list[Gathered] | Exception] = []
    pending: dict[str, tuple[int, int, Gathered]] = {}  # request id -> call, prompt, outputs
    for number, (prompt_ids, kwargs, lora, _) in enumerate(calls):
        mine = [Gathered([Completion(i) for i in range(kwargs["n"])]) for _ in prompt_ids]
        added: list[str] = []
        try:
            params = make_params(kwargs)
            for prompt in vllm_prompts(prompt_ids):
                request_id = f"twinkle-{next(_request_numbers)}"
                llm.add_request(request_id, prompt, params, lora_request=lora)
                added.append(request_id)
        except Exception as exc:  # noqa: BLE001 - this call's refusal, handed back
            if added:
                llm.abort_request(added)
            results.append(exc)
            continue
        for prompt, (request_id, gathered) in enumerate(zip(added, mine, strict=True)):
            pending[request_id] = (number, prompt, gathered)
        results.append(mine)
    try:
        while pending:
            if not llm.has_unfinished_requests():
                raise RuntimeError(f"vLLM has no requests left but {len(pending)} never finished")
            for output in llm.step():
                entry = pending.get(output.request_id)
                if entry is None:
                    continue
                number, prompt, gathered = entry
                try:
                    _take(output, gathered, prompt, calls[number])
                except Exception as exc:  # noqa: BLE001 - this call's failure alone
                    results[number] = exc
                    dropped = [rid for rid, e in pending.items() if e[0] == number]
                    llm.abort_request(dropped)
                    for rid in dropped:
                        del pending[rid]
                    continue
                if gathered.done:
                    del pending[output.request_id]
    except BaseException:
        if pending:
            llm.abort_request(list(pending))
        raise
    return results


def _take(output: Any, gathered: Gathered, prompt: int, call: Call) -> None:
    """One step's ``RequestOutput`` of a prompt into what was gathered, each new token told
    to the call's listener."""
    _, kwargs, _, on_token = call
    if gathered.prompt_logprobs is None:
        gathered.prompt_logprobs = getattr(output, "prompt_logprobs", None)
    for delta in output.outputs:
        completion = gathered.outputs[delta.index]
        tokens = list(delta.token_ids)
        positions = list(delta.logprobs or [])
        if len(positions) != len(tokens):
            raise ValueError(
                f"vLLM returned {len(positions)} logprob entries for {len(tokens)} tokens; "
                "sample with logprobs >= 0"
            )
        completion.token_ids += tokens
        completion.logprobs += positions
        completion.text += delta.text or ""
        if delta.finish_reason is not None:
            completion.finish_reason = str(delta.finish_reason)
        if on_token is not None:
            row = prompt * kwargs["n"] + delta.index
            for token, position in zip(tokens, positions, strict=True):
                on_token(row, token, top_logprobs(token, position, kwargs["logprobs"]))
