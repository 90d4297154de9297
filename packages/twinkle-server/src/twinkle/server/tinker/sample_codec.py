"""The result of Tinker's ``asample`` in both encodings: protobuf ``SampleResponse`` (SDK
0.38, which accepts nothing else) and 0.16.1's JSON.

Per-token logprobs are always sent (the SDK has no flag for them and RL code asserts they
are there). Prompt logprobs hold one value per prompt token with NaN (JSON: null) where
nothing is scored, position 0 always. Top-k rows are ``k`` (token, logprob) pairs; the
protobuf form is an N x k grid whose missing cells are token 0 with logprob -99999, and a
row of missing cells (prompt position 0) reads as None in the SDK.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from twinkle.server.tinker import proto_schema as schema
from twinkle.server.tinker.results import ProtoResult

TopkRow = Sequence[tuple[int, float]]
MISSING_LOGPROB = -99999.0
STOP_REASONS = {"stop": schema.STOP_REASON_STOP, "length": schema.STOP_REASON_LENGTH}


@dataclass(frozen=True)
class TinkerSequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" or "length"
    topk: list[TopkRow] | None = None  # one row per token, when topk_sample_logprobs > 0


@dataclass(frozen=True)
class PromptScores:
    """What was asked about the prompt: its logprobs and/or its top-k rows (None at 0)."""

    logprobs: list[float | None] | None = None
    topk: list[TopkRow | None] | None = None


def _topk_grid(msg, rows: Sequence[TopkRow | None], k: int) -> None:
    ids = np.zeros((len(rows), k), dtype="<i4")
    values = np.full((len(rows), k), MISSING_LOGPROB, dtype="<f4")
    for i, row in enumerate(rows):
        for j, (token, logprob) in enumerate((row or [])[:k]):
            ids[i, j], values[i, j] = token, logprob
    msg.token_ids, msg.logprobs = ids.tobytes(), values.tobytes()
    msg.k, msg.length = k, len(rows)


def _width(rows: Sequence[TopkRow | None]) -> int:
    return max((len(row) for row in rows if row), default=0)


def encode_sample_response(
    sequences: Sequence[TinkerSequence], prompt: PromptScores | None = None
) -> ProtoResult:
    prompt = prompt or PromptScores()
    msg = schema.message("SampleResponse")()
    for seq in sequences:
        if seq.stop_reason not in STOP_REASONS:
            raise ValueError(f"stop_reason must be 'stop' or 'length', got {seq.stop_reason!r}")
        out = msg.sequences.add(stop_reason=STOP_REASONS[seq.stop_reason])
        out.tokens = np.asarray(seq.tokens, dtype="<i4").tobytes()
        out.logprobs = np.asarray(seq.logprobs, dtype="<f4").tobytes()
        if seq.topk is not None and _width(seq.topk):
            _topk_grid(out.topk_sampled_logprobs, seq.topk, _width(seq.topk))
    if prompt.logprobs is not None:
        values = [math.nan if v is None else v for v in prompt.logprobs]
        msg.prompt_logprobs = np.asarray(values, dtype="<f4").tobytes()
    if prompt.topk is not None and _width(prompt.topk):
        _topk_grid(msg.topk_prompt_logprobs, prompt.topk, _width(prompt.topk))
    return ProtoResult(json=_json(sequences, prompt), proto=msg.SerializeToString())


def _json(sequences: Sequence[TinkerSequence], prompt: PromptScores) -> dict:
    """SDK 0.16.1's SampleResponse (JSON has no NaN: unscored positions are null)."""
    result: dict = {
        "type": "sample",
        "sequences": [
            {"stop_reason": s.stop_reason, "tokens": list(s.tokens), "logprobs": list(s.logprobs)}
            for s in sequences
        ],
    }
    if prompt.logprobs is not None:
        result["prompt_logprobs"] = [
            None if v is None or math.isnan(v) else float(v) for v in prompt.logprobs
        ]
    if prompt.topk is not None:
        result["topk_prompt_logprobs"] = [
            None if not row else [[int(t), float(lp)] for t, lp in row] for row in prompt.topk
        ]
    return result
