"""The ``/v1`` routes. Each request is checked whole before anything is queued (a 4xx names
the field), then sampled on the sampler's worker in the caller's lane."""

from __future__ import annotations

import asyncio
import secrets
import time
from concurrent.futures import Future
from functools import lru_cache
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from twinkle.data_format import InputFeature, SampleResponse, SamplingParams
from twinkle.server.auth import Principal
from twinkle.server.errors import BadRequest, Unavailable
from twinkle.server.limits import check_sequences, check_tokens
from twinkle.server.openai import answers, params, served_models
from twinkle.server.openai.live_stream import DONE, LiveStream
from twinkle.server.routes.common import caller, json_body, ready, state_of
from twinkle.server.state import ServerState

router = APIRouter()
ROLES = ("system", "user", "assistant", "tool", "developer")


@lru_cache(maxsize=4)
def template_for(model_id: str) -> Any:
    """The base model's own chat template and tokenizer (loaded once per process)."""
    from twinkle.template import Template

    return Template(model_id)


@router.get("/models")
async def list_models(request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    models = served_models.listed(state, principal)
    return {"object": "list", "data": [_model_json(m) for m in models]}


@router.get("/models/{model:path}")
async def get_model(model: str, request: Request) -> dict:
    principal = caller(request)
    return _model_json(served_models.resolve(ready(state_of(request)), principal, model))


@router.post("/chat/completions")
async def chat_completions(request: Request) -> Any:
    return await _complete(request, chat=True)


@router.post("/completions")
async def completions(request: Request) -> Any:
    return await _complete(request, chat=False)


async def _complete(request: Request, chat: bool) -> Any:
    principal = caller(request)
    state = _sampling(ready(state_of(request)))
    body = await json_body(request)
    asked = params.read(body, state.config, chat, state.sampler.vocab_size())
    model = served_models.resolve(state, principal, asked.model)
    template = await asyncio.to_thread(template_for, state.config.model.model_id)
    # Rendering and tokenizing long prompts is CPU work: off the event loop.
    build = _chat_prompt if chat else lambda b, t: _text_prompts(b, state, t)
    prompts = await asyncio.to_thread(build, body, template)
    for index, prompt in enumerate(prompts):
        check_tokens(len(prompt.input_ids), state.config.limits, f"prompt {index}")
    check_sequences(len(prompts), asked.params.num_samples, state.config.limits)
    prefix = "chatcmpl-" if chat else "cmpl-"
    answer = answers.Answer(prefix + secrets.token_hex(12), int(time.time()), asked.model, chat)
    live = None
    if asked.stream and state.sampler.streams_tokens:
        live = LiveStream(asyncio.get_running_loop(), asked.params.num_samples)
    future = _submit(state, principal, asked, model.folder, prompts, live)
    prompt_tokens = [len(p.input_ids) * asked.params.num_samples for p in prompts]
    meter = request.app.state.meter
    future.add_done_callback(lambda f: _count(meter, principal, f, prompt_tokens))
    tokenizer, top = template.tokenizer, asked.top_logprobs
    if live is not None:
        return await _live_answer(live, future, answer, asked, tokenizer, prompt_tokens)
    responses: list[SampleResponse] = await asyncio.wrap_future(future)
    if not asked.stream:
        return answers.whole(answer, responses, prompt_tokens, tokenizer, top)
    events = answers.stream(answer, responses, prompt_tokens, tokenizer, top, asked.include_usage)
    return StreamingResponse(events, media_type="text/event-stream")


def _submit(
    state: ServerState,
    principal: Principal,
    asked: params.Request,
    folder: str | None,
    prompts: list[InputFeature],
    live: LiveStream | None,
) -> Future:
    """Queue the prompts' samples in the caller's lane of the sampler's worker."""
    work = [
        state.sampler.sample_tokens(
            p.input_ids,
            _seeded(asked.params, state, principal),
            folder,
            None if live is None else live.listener(index),
        )
        for index, p in enumerate(prompts)
    ]
    return state.sampler.worker.submit(
        principal.key_id,
        lambda: [job() for job in work],
        timeout=state.config.limits.request_timeout_s,
    )


async def _live_answer(
    live: LiveStream,
    future: Future,
    answer: answers.Answer,
    asked: params.Request,
    tokenizer: Any,
    prompt_tokens: list[int],
) -> StreamingResponse:
    """The stream, begun once the first token is drawn: work that fails before any token is
    answered as that failure (a 4xx for the caller's mistake), not as a broken stream."""
    live.watch(future)
    first = await live.first()
    if first is DONE:
        await asyncio.wrap_future(future)
    stops = tuple(s for s in asked.params.stop or () if isinstance(s, str))

    def finish(responses: list[SampleResponse]):
        return answers.end_chunks(answer, responses, prompt_tokens, asked.include_usage)

    top = asked.top_logprobs
    events = live.events(first, future, answer, tokenizer, top, stops, finish)
    return StreamingResponse(events, media_type="text/event-stream")


def _count(meter: Any, principal: Principal, done: Future, prompt_tokens: list[int]) -> None:
    """The finished sample's usage, counted even when its client went away mid-stream."""
    if done.cancelled() or done.exception() is not None:
        return
    counted = answers.usage(done.result(), prompt_tokens)
    amounts = {
        "requests": 1,
        "sampled_tokens": counted["completion_tokens"],
        "prompt_tokens": counted["prompt_tokens"],
    }
    meter.add_usage(principal.key_id, amounts)


def _seeded(params: SamplingParams, state: ServerState, principal: Principal) -> SamplingParams:
    """Unseeded prompts draw from the key's own stream of seeds, one each (as on the other
    sampler routes): a tenant's samples do not depend on how often others sampled."""
    if params.seed is not None:
        return params
    return params.model_copy(update={"seed": state.sampler.next_seed(principal.key_id)})


def _sampling(state: ServerState) -> ServerState:
    if state.sampler is None or not state.sampler.available:
        raise Unavailable("this server has no sampler enabled (sampler.enabled in its config)")
    return state


def _chat_prompt(body: dict[str, Any], template: Any) -> list[InputFeature]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content} objects")
    turns = [_message(index, m) for index, m in enumerate(messages)]
    if turns[-1]["role"] == "assistant":
        raise BadRequest("the last message is the assistant's: end with a user or tool turn")
    try:
        return [template.encode({"messages": turns}, add_generation_prompt=True)]
    except (ValueError, TypeError) as exc:
        raise BadRequest(
            f"messages cannot be rendered by the model's chat template: {exc}"
        ) from None


def _message(index: int, message: Any) -> dict[str, str]:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise BadRequest(f"messages[{index}] needs a role among {', '.join(ROLES)}")
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise BadRequest(f"messages[{index}].content: only text parts are supported")
        content = "".join(str(p.get("text", "")) for p in content)
    if not isinstance(content, str):
        raise BadRequest(f"messages[{index}].content must be a string or a list of text parts")
    role = "system" if message["role"] == "developer" else message["role"]
    return {"role": role, "content": content}


def _text_prompts(body: dict[str, Any], state: ServerState, template: Any) -> list[InputFeature]:
    prompts = params.prompt_token_lists(body.get("prompt"), state.config)
    tokenizer = template.tokenizer
    ids = [
        tokenizer.encode(p, add_special_tokens=False) if isinstance(p, str) else p for p in prompts
    ]
    vocab = state.sampler.vocab_size()
    for index, tokens in enumerate(ids):
        if vocab is not None and any(t < 0 or t >= vocab for t in tokens):
            raise BadRequest(f"prompt {index} holds a token id outside [0, {vocab - 1}]")
    return [InputFeature(input_ids=tokens) for tokens in ids]


def _model_json(model: served_models.ServedModel) -> dict[str, Any]:
    return {"id": model.id, "object": "model", "created": model.created, "owned_by": model.owned_by}
