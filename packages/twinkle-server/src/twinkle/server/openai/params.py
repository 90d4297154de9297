"""An OpenAI request body read into what the sampler takes, every value checked first.

A value out of range is a 400 naming the field (``temperature must be a finite number in
[0, 2]``); a field this server does not implement (``tools``, ``logit_bias``, ``echo``) is
a 400 saying so instead of being silently ignored, since the answer would not be what the
caller asked for. Unknown fields the OpenAI clients add as defaults are accepted when they
hold their default value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinkle.data_format import SamplingParams
from twinkle.server.checks import integer, number
from twinkle.server.config import ServerConfig
from twinkle.server.errors import BadRequest
from twinkle.server.limits import check_num_samples, check_rows
from twinkle.server.sampling_params import check_sampling_values

MAX_TOP_LOGPROBS = 20
COMPLETIONS_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
# Fields that change the answer, and the value under which they change nothing.
NOT_IMPLEMENTED = {
    "tools": None,
    "tool_choice": None,
    "functions": None,
    "function_call": None,
    "logit_bias": None,
    "response_format": None,
    "suffix": None,
    "echo": False,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "audio": None,
    "modalities": None,
    "prediction": None,
}


@dataclass(frozen=True)
class Request:
    model: str
    params: SamplingParams
    stream: bool
    include_usage: bool
    top_logprobs: int | None  # None: no logprobs asked for


def read(body: dict[str, Any], config: ServerConfig, chat: bool, vocab: int | None) -> Request:
    """The sampling request of a chat (``chat``) or completions body."""
    if not isinstance(body.get("model"), str):
        raise BadRequest("the request needs 'model' (a string): GET /v1/models lists them")
    _refuse_unimplemented(body)
    n = check_num_samples(1 if body.get("n") is None else body["n"], config.limits, "n")
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise BadRequest("best_of is not supported (only best_of == n, or leave it out)")
    raw = {
        "max_tokens": _max_tokens(body, config, chat),
        "temperature": _optional(body, "temperature", lambda v: number(v, "temperature", 0, 2)),
        "top_p": _optional(body, "top_p", lambda v: number(v, "top_p", 0, 1, low_open=True)),
        "seed": body.get("seed"),
        "stop": _stop(body.get("stop")),
        "top_k": body.get("top_k"),  # top_k and ignore_eos: not OpenAI's, but vLLM's
        "ignore_eos": _flag(body, "ignore_eos") or None,  # servers take them too
    }
    raw = {k: v for k, v in raw.items() if v is not None}
    check_sampling_values(raw, config.sampler.max_tokens, vocab)
    top = _top_logprobs(body, chat)
    params = SamplingParams.model_validate({**raw, "num_samples": n, "logprobs": top})
    stream = _flag(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object")
    include_usage = _flag(options, "include_usage")
    return Request(body["model"], params, stream, include_usage, top)


def prompt_token_lists(prompt: Any, config: ServerConfig) -> list[list[int] | str]:
    """A completions ``prompt`` as a list of prompts: a string, a list of strings, a token
    list or a list of token lists (OpenAI's four forms)."""
    prompts = _prompt_list(prompt)
    if prompts is None:
        raise BadRequest(
            "prompt must be a non-empty string, a list of strings, a list of token ids or a "
            "list of non-empty token id lists"
        )
    check_rows(len(prompts), config.limits, "prompt")
    if any(isinstance(p, str) and not p for p in prompts):
        raise BadRequest("prompt holds an empty string; give each prompt some text")
    return prompts


def _prompt_list(prompt: Any) -> list | None:
    if isinstance(prompt, str):
        return [prompt]
    if not isinstance(prompt, list) or not prompt:
        return None
    if all(_is_token(t) for t in prompt):
        return [prompt]
    each = (
        isinstance(p, str) or (isinstance(p, list) and p and all(map(_is_token, p))) for p in prompt
    )
    return prompt if all(each) else None


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse_unimplemented(body: dict[str, Any]) -> None:
    used = sorted(
        name
        for name, neutral in NOT_IMPLEMENTED.items()
        if body.get(name) is not None and body.get(name) != neutral and body.get(name) != []
    )
    if used:
        raise BadRequest(f"this server does not implement {', '.join(used)}; leave them out")


def _optional(body: dict[str, Any], name: str, check) -> Any:
    return None if body.get(name) is None else check(body[name])


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false, got {value!r}")
    return value


def _max_tokens(body: dict[str, Any], config: ServerConfig, chat: bool) -> int:
    """The completion's token budget; over the server's limit is a 413 (checked after)."""
    for name in ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",):
        if body.get(name) is not None:
            return integer(body[name], name, 1)
    return (
        config.sampler.max_tokens
        if chat
        else min(COMPLETIONS_MAX_TOKENS, config.sampler.max_tokens)
    )


def _stop(stop: Any) -> Any:
    if stop is None or isinstance(stop, str):
        return [stop] if stop else None
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop or None
    raise BadRequest(f"stop must be a string or a list of strings, got {stop!r}")


def _top_logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """How many alternatives per token to return, or None for no logprobs: chat asks with
    ``logprobs: true`` and ``top_logprobs: k``; completions with ``logprobs: k``."""
    if chat:
        if not _flag(body, "logprobs"):
            if body.get("top_logprobs") is not None:
                raise BadRequest("top_logprobs needs logprobs: true")
            return None
        top = body.get("top_logprobs")
        return 0 if top is None else integer(top, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    top = body.get("logprobs")
    return None if top is None else integer(top, "logprobs", 0, MAX_TOP_LOGPROBS)
