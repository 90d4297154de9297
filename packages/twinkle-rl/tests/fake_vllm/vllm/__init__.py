"""A stand-in for vLLM, of the interface vLLMSampler drives, for machines without a GPU.

Tests put ``tests/fake_vllm`` on ``sys.path``; ``import vllm`` then finds this package. It
follows vLLM's v1 offline engine as the sampler uses it: ``LLM(model=..., seed=...,
**engine_args)`` whose ``llm_engine`` takes ``add_request(request_id, prompt, params,
lora_request=...)`` and hands back ``RequestOutput``s from ``step()``. Only
``RequestOutputKind.DELTA`` is implemented (each step's new tokens, text and logprobs per
child of an ``n > 1`` request, each its own ``RequestOutput`` with ``index``, as vLLM's
output processor makes them); a prompt longer than ``max_model_len`` is refused at
``add_request`` with vLLM's message. Tokens are not a model's: each is drawn from a generator
seeded by the request's seed, prompt, child, position and adapter, so runs repeat. Stop
token ids, stop strings (cut from the text, the text held back while it could still become
one) and ``max_tokens`` end a child as in vLLM.

``LLM.llm_engine.on_step`` (a callable or None) runs at the start of every ``step``, so a
test can see what was heard between steps.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm.lora.request import LoRARequest
from vllm.sampling_params import RequestOutputKind, SamplingParams

__version__ = "0.0.0+fake"
__all__ = ["LLM", "CompletionOutput", "Logprob", "RequestOutput", "SamplingParams"]


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    lora_request: LoRARequest | None = None


@dataclass
class _Child:
    index: int
    tokens: list[int] = field(default_factory=list)
    sent_tokens: int = 0
    sent_text: int = 0
    cumulative: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs_sent: bool = False


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    lora: LoRARequest | None
    children: list[_Child]

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.children)


class ModelConfig:
    def __init__(self, folder: Path, max_model_len: int) -> None:
        self._vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        self.max_model_len = max_model_len

    def get_vocab_size(self) -> int:
        return self._vocab


class LLMEngine:
    def __init__(self, tokenizer: Any, model_config: ModelConfig, seed: int) -> None:
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.seed = seed
        self.requests: dict[str, _Request] = {}
        self.aborted: list[str] = []
        self.steps = 0
        self.on_step: Any = None
        self.lora_seen: list[LoRARequest | None] = []

    def add_request(
        self,
        request_id: str,
        prompt: Any,
        params: Any,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
        tokenization_kwargs: dict | None = None,
        trace_headers: Any = None,
        priority: int = 0,
    ) -> None:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be SamplingParams, got {type(params).__name__}")
        if params.output_kind != RequestOutputKind.DELTA:
            raise NotImplementedError("the fake vLLM implements only RequestOutputKind.DELTA")
        if request_id in self.requests:
            raise ValueError(f"Request id {request_id} already running.")
        ids = list(prompt["prompt_token_ids"])
        if not ids:
            raise ValueError("The decoder prompt cannot be empty")
        limit = self.model_config.max_model_len
        if len(ids) > limit:
            raise ValueError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model "
                f"length of {limit}. Make sure that `max_model_len` is no smaller than the "
                "number of text tokens."
            )
        if lora_request is not None and not Path(lora_request.lora_path).is_dir():
            raise ValueError(f"Loading lora {lora_request.lora_name} failed: no such folder")
        self.lora_seen.append(lora_request)
        children = [_Child(i) for i in range(params.n)]
        self.requests[request_id] = _Request(request_id, ids, params, lora_request, children)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def abort_request(self, request_ids: list[str], internal: bool = False) -> None:
        for request_id in request_ids:
            if self.requests.pop(request_id, None) is not None:
                self.aborted.append(request_id)

    def step(self) -> list[RequestOutput]:
        if self.on_step is not None:
            self.on_step()
        self.steps += 1
        outputs = []
        for request in list(self.requests.values()):
            for child in request.children:
                if child.finish_reason is None:
                    outputs.append(self._advance(request, child))
            if request.finished:
                del self.requests[request.request_id]
        for output in outputs:
            output.finished = output.request_id not in self.requests
        return outputs

    def _draw(self, request: _Request, child: _Child) -> tuple[int, dict[int, Logprob]]:
        params = request.params
        seed = self.seed if params.seed is None else params.seed + child.index
        lora = None if request.lora is None else request.lora.lora_name
        key = f"{seed}|{request.prompt}|{child.index}|{len(child.tokens)}|{lora}"
        draw = random.Random(key)
        high = min(self.model_config.get_vocab_size(), 1000)
        token = draw.randrange(10, high)
        position = {token: Logprob(-draw.uniform(0.1, 2.0), rank=1)}
        for rank in range(2, (params.logprobs or 0) + 2):
            other = draw.randrange(10, high)
            if other not in position:
                position[other] = Logprob(-2.0 - rank, rank=rank)
        return token, position

    def _advance(self, request: _Request, child: _Child) -> RequestOutput:
        params = request.params
        token, position = self._draw(request, child)
        child.tokens.append(token)
        child.cumulative += position[token].logprob
        stops = params.stop or []
        text = self.tokenizer.decode(child.tokens, skip_special_tokens=params.skip_special_tokens)
        found = [(text.find(s), s) for s in stops if s in text]
        if token in (params.stop_token_ids or []):
            child.finish_reason, child.stop_reason = "stop", token
        elif found:
            cut, stop = min(found)
            text = text[:cut]
            child.finish_reason, child.stop_reason = "stop", stop
        elif len(child.tokens) >= params.max_tokens:
            child.finish_reason = "length"
        if child.finish_reason is None and stops:
            text = text[: max(len(text) - max(len(s) for s in stops) + 1, child.sent_text)]
        delta_tokens = child.tokens[child.sent_tokens :]
        positions = [position] if params.logprobs is not None else None
        completion = CompletionOutput(
            index=child.index,
            text=text[child.sent_text :],
            token_ids=delta_tokens,
            cumulative_logprob=child.cumulative,
            logprobs=positions,
            finish_reason=child.finish_reason,
            stop_reason=child.stop_reason,
        )
        child.sent_tokens, child.sent_text = len(child.tokens), max(len(text), child.sent_text)
        prompt_logprobs = None
        if params.prompt_logprobs is not None and not child.prompt_logprobs_sent:
            prompt_logprobs = [None] + [{t: Logprob(-1.0, rank=1)} for t in request.prompt[1:]]
            child.prompt_logprobs_sent = True
        return RequestOutput(
            request_id=request.request_id,
            prompt=None,
            prompt_token_ids=request.prompt,
            prompt_logprobs=prompt_logprobs,
            outputs=[completion],
            finished=False,
            lora_request=request.lora,
        )


class LLM:
    def __init__(self, model: str, seed: int = 0, **engine_args: Any) -> None:
        from transformers import AutoTokenizer

        folder = Path(model)
        self.engine_args = engine_args
        config = ModelConfig(folder, int(engine_args.get("max_model_len", 256)))
        tokenizer = AutoTokenizer.from_pretrained(folder)
        self.llm_engine = LLMEngine(tokenizer, config, seed)
        self.prefix_cache_resets = 0
        self.sleeping = False

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def reset_prefix_cache(self) -> bool:
        self.prefix_cache_resets += 1
        return True

    def sleep(self, level: int = 1) -> None:
        self.sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleeping = False
