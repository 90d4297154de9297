"""Tinker's ``asample`` body as a Twinkle sampling call, and the sampler's answer back.

Defaults are filled in for SDK 0.16.1, which sends only the fields it set (``max_tokens``
missing means this server's limit). ``stop``: null stops at the end-of-sequence tokens; a
string or a list of strings or token ids adds those stops; ``[]`` disables every stop,
EOS included, so the completion runs to ``max_tokens``. Options this server does not
implement (``prompt_alt_tokens_k``, ``prompt_logprobs_last_n``, ``target_prompt_logprobs``,
``record_stability_info``) are refused with a user error rather than ignored: the SDK
would otherwise read a response that lacks what it asked for.

Logprobs are those of the model's own distribution (temperature 1, no top-k/top-p), the
quantity the trainer's forward computes for the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinkle.data_format import SampleResponse, SamplingParams
from twinkle.server.checks import refuse_nulls
from twinkle.server.config import Limits as RequestLimits
from twinkle.server.errors import BadRequest, ServerFailure
from twinkle.server.limits import check_num_samples
from twinkle.server.sampling_params import check_sampling_values
from twinkle.server.tinker.codec import tokens_from_json
from twinkle.server.tinker.results import ProtoResult
from twinkle.server.tinker.sample_codec import PromptScores, TinkerSequence, encode_sample_response

MAX_TOP_K = 20
UNSUPPORTED = {
    "prompt_alt_tokens_k": lambda v: v not in (None, 0),
    "prompt_logprobs_last_n": lambda v: v is not None,
    "target_prompt_logprobs": lambda v: v is not None,
    "record_stability_info": lambda v: bool(v),
}
PARAM_KEYS = {"max_tokens", "seed", "stop", "temperature", "top_k", "top_p"}
NON_OPTIONAL_PARAMS = ("temperature", "top_k", "top_p")  # the SDK's plain floats and ints


@dataclass(frozen=True)
class Limits:
    max_tokens: int  # the sampler's max_tokens
    request: RequestLimits  # the server's limits: prompt tokens, num_samples, nesting
    vocab_size: int | None  # None: not checked here


@dataclass(frozen=True)
class AsampleRequest:
    prompt: list[int]
    params: SamplingParams
    prompt_logprobs: bool
    topk_prompt: int
    topk_sample: int


def _int(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"{name} must be an int in {low}..{high}, got {value!r}")
    return value


def _stop(raw: Any) -> tuple[Any, bool]:
    """Twinkle's ``stop`` and ``ignore_eos`` for Tinker's ``stop``."""
    if raw is None:
        return None, False
    if isinstance(raw, list) and not raw:
        return None, True
    if isinstance(raw, str) and not raw:
        raise BadRequest("a stop string must not be empty")
    return raw, False


def _params(raw: Any, num_samples: int, want_prompt: int | None, top: int, limits: Limits):
    if not isinstance(raw, dict):
        raise BadRequest("sampling_params must be an object, e.g. {max_tokens: 64}")
    unknown = set(raw) - PARAM_KEYS
    if unknown:
        raise BadRequest(f"sampling_params keys {sorted(unknown)} are unknown; use {PARAM_KEYS}")
    refuse_nulls(raw, NON_OPTIONAL_PARAMS, "sampling_params")
    check_sampling_values(raw, limits.max_tokens, limits.vocab_size)
    max_tokens = raw.get("max_tokens")
    max_tokens = limits.max_tokens if max_tokens is None else max_tokens
    stop, ignore_eos = _stop(raw.get("stop"))
    values = {k: v for k, v in raw.items() if v is not None and k not in ("stop", "max_tokens")}
    try:
        return SamplingParams(
            **values,
            max_tokens=max_tokens,
            stop=stop,
            ignore_eos=ignore_eos,
            num_samples=num_samples,
            logprobs=top,
            prompt_logprobs=want_prompt,
        )
    except ValueError as exc:
        raise BadRequest(f"invalid sampling_params: {exc}") from None


def parse_asample(body: dict[str, Any], limits: Limits) -> AsampleRequest:
    """Check an asample body before it is queued (every problem is a 4xx now)."""
    for name, unsupported in UNSUPPORTED.items():
        if unsupported(body.get(name)):
            raise BadRequest(f"{name} is not supported by this server; leave it unset")
    prompt = tokens_from_json(body.get("prompt"), "prompt", limits.request)
    if not prompt:
        raise BadRequest("the prompt has no tokens")
    vocab = limits.vocab_size
    if min(prompt) < 0 or (vocab is not None and max(prompt) >= vocab):
        raise BadRequest(f"the prompt holds token ids outside the vocabulary [0, {vocab})")
    num_samples = body.get("num_samples")
    num_samples = 1 if num_samples is None else check_num_samples(num_samples, limits.request)
    want_prompt = body.get("prompt_logprobs")
    if want_prompt is not None and not isinstance(want_prompt, bool):
        raise BadRequest(f"prompt_logprobs must be true or false, got {want_prompt!r}")
    topk_prompt = _int(body, "topk_prompt_logprobs", 0, 0, MAX_TOP_K)
    topk_sample = _int(body, "topk_sample_logprobs", 0, 0, MAX_TOP_K)
    scored = bool(want_prompt) or topk_prompt > 0
    raw = body.get("sampling_params")
    params = _params(raw, num_samples, topk_prompt if scored else None, topk_sample, limits)
    return AsampleRequest(prompt, params, bool(want_prompt), topk_prompt, topk_sample)


def tinker_result(response: SampleResponse, request: AsampleRequest) -> ProtoResult:
    """A Twinkle SampleResponse (pairs: the token's own first, then the top k) as Tinker's."""
    sequences = []
    for seq in response.sequences:
        if seq.stop_reason not in ("stop", "length") or seq.logprobs is None:
            raise ServerFailure(f"the sampler ended a sequence with {seq.stop_reason!r}")
        sequences.append(
            TinkerSequence(
                tokens=list(seq.tokens),
                logprobs=[pairs[0][1] for pairs in seq.logprobs],
                stop_reason=seq.stop_reason,
                topk=[pairs[1:] for pairs in seq.logprobs] if request.topk_sample else None,
            )
        )
    entries = response.prompt_logprobs
    prompt = PromptScores()
    if entries is not None:
        prompt = PromptScores(
            logprobs=[None if e is None else e[0][1] for e in entries]
            if request.prompt_logprobs
            else None,
            topk=[None if e is None else e[1:] for e in entries] if request.topk_prompt else None,
        )
    return encode_sample_response(sequences, prompt)
