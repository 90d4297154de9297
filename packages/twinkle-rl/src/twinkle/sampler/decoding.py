"""Batched autoregressive generation with a Hugging Face causal LM and its KV cache.

Prompts are left-padded into one batch, the prompt runs once, then each step feeds one token
per row through the cache. Each row samples with its own ``torch.Generator``, so a row's
completion depends on its seed, not on which other rows share the batch (up to float
rounding of the batched matmuls).

The logprobs reported are those of the model's own distribution (temperature 1, no top-k or
top-p), the quantity the trainer computes for the same tokens; temperature and the filters
only change which token is drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from twinkle.data_format import SamplingParams, TopLogprobs
from twinkle.sampler.stopping import StopRule

TokenCallback = Callable[[int, int, TopLogprobs], None]
"""Called as ``(row, token id, its logprob pairs)`` for each token a row draws, in order."""


@dataclass
class RowResult:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TopLogprobs] = field(default_factory=list)
    stop_reason: str = "length"
    prompt_logprobs: list[TopLogprobs | None] | None = None


def _filtered_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) on (B, V) float32 logits."""
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens before it already cover top_p (the first always stays).
        drop = probs.cumsum(dim=-1) - probs >= params.top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def _pick(
    logits: torch.Tensor, params: SamplingParams, generators: Sequence[torch.Generator]
) -> torch.Tensor:
    """Greedy at temperature 0; else inverse-CDF sampling: one uniform number per row from
    the row's own generator, located in the row's cumulative distribution (float64, so
    rounding cannot move it across a token of real probability). Filtered-out tokens have
    zero width and are never drawn."""
    if params.temperature == 0:
        return logits.argmax(dim=-1)
    cdf = _filtered_logits(logits, params).softmax(dim=-1).double().cumsum(dim=-1)
    uniform = torch.cat([torch.rand(1, generator=g, device=g.device) for g in generators])
    targets = (uniform.to(cdf.device, torch.float64) * cdf[:, -1])[:, None]
    chosen = torch.searchsorted(cdf, targets, right=True)[:, 0]
    return chosen.clamp(max=logits.shape[-1] - 1)


def _entries(logps: torch.Tensor, chosen: torch.Tensor, top: int) -> list[TopLogprobs]:
    """Per row: the chosen token's (id, logprob), then the ``top`` best."""
    chosen_lp = logps.gather(-1, chosen[:, None])[:, 0].tolist()
    rows = [[(t, lp)] for t, lp in zip(chosen.tolist(), chosen_lp, strict=True)]
    if top:
        values, ids = torch.topk(logps, top, dim=-1)
        for row, row_ids, row_values in zip(rows, ids.tolist(), values.tolist(), strict=True):
            row.extend(zip(row_ids, row_values, strict=True))
    return rows


def _prompt_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, lengths: list[int], top: int
) -> list[list[TopLogprobs | None]]:
    """Per prompt: None at its first token, then each token's logprob given the ones before."""
    width = input_ids.shape[1]
    result = []
    for row, length in enumerate(lengths):
        start = width - length
        logps = logits[row, start : width - 1].float().log_softmax(-1)
        entries = _entries(logps, input_ids[row, start + 1 :], top) if length > 1 else []
        result.append([None, *entries])
    return result


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    generators: Sequence[torch.Generator],
    stop: StopRule,
    decode: Callable[[list[int]], str],
    pad_token_id: int,
    device: torch.device,
    model_kwargs: dict | None = None,
    on_token: TokenCallback | None = None,
) -> list[RowResult]:
    """Sample one completion per prompt (``generators[i]`` drives row i); ``model_kwargs``
    go to every forward (peft's per-row ``adapter_names``); ``on_token`` hears each row's
    tokens as they are drawn (a server streams them)."""
    model_kwargs = model_kwargs or {}
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.as_tensor(prompt)
        attention_mask[row, width - len(prompt) :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    want_prompt = params.prompt_logprobs is not None
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=0 if want_prompt else 1,
        **model_kwargs,
    )
    results = [RowResult() for _ in prompts]
    if want_prompt:
        per_prompt = _prompt_logprobs(out.logits, input_ids, lengths, params.prompt_logprobs)
        for result, entries in zip(results, per_prompt, strict=True):
            result.prompt_logprobs = entries
    cache, logits = out.cache, out.logits[:, -1].float()
    positions = position_ids[:, -1:]
    active = [True] * len(prompts)
    top = params.logprobs or 0
    for step in range(params.max_tokens):
        chosen = _pick(logits, params, generators)
        entries = _entries(logits.log_softmax(-1), chosen, top)
        for row, token in enumerate(chosen.tolist()):
            if not active[row]:
                continue
            result = results[row]
            result.tokens.append(token)
            result.logprobs.append(entries[row])
            if on_token is not None:
                on_token(row, token, entries[row])
            if stop.stops_at_token(token) or stop.stops_in_text(result.tokens, decode):
                result.stop_reason, active[row] = "stop", False
        if not any(active) or step == params.max_tokens - 1:
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(prompts), 1))], 1)
        positions = positions + 1
        out = model(
            input_ids=chosen[:, None],
            attention_mask=attention_mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
            **model_kwargs,
        )
        cache, logits = out.cache, out.logits[:, -1].float()
    return results
