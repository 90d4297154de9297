"""The sampling parameters a client sends, checked before a sample is queued.

Both sampler routes (Twinkle's ``/twinkle/sampler/sample`` and Tinker's ``asample``) pass
their raw ``sampling_params`` through ``check_sampling_values``, so a NaN temperature, a
seed torch cannot take (``2**70``), a ``top_k`` larger than the vocabulary or a stop token
that is no token (``-1``) is a 400 naming the field and its range, never a 500 from the
sampler or a stop that silently never matches.
"""

from __future__ import annotations

from typing import Any

from twinkle.server.checks import INT64_MAX, integer, number
from twinkle.server.errors import BadRequest, PayloadTooLarge

MAX_STOPS = 32


def check_sampling_values(raw: dict[str, Any], max_tokens: int, vocab_size: int | None) -> None:
    """Range-check the numbers in ``raw`` (absent or null fields take their defaults later).
    ``max_tokens`` is the server's limit; ``vocab_size`` None leaves token ids to the
    sampler (it runs elsewhere)."""
    if raw.get("max_tokens") is not None:
        tokens = raw["max_tokens"]
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > max_tokens:
            raise PayloadTooLarge(f"max_tokens {tokens} exceeds this server's limit, {max_tokens}")
        integer(tokens, "sampling_params.max_tokens", 1, max_tokens)
    if raw.get("temperature") is not None:
        number(raw["temperature"], "sampling_params.temperature", 0)
    if raw.get("top_p") is not None:
        number(raw["top_p"], "sampling_params.top_p", 0, 1, low_open=True)
    if raw.get("top_k") is not None and raw["top_k"] != -1:
        top = vocab_size if vocab_size is not None else INT64_MAX
        try:
            integer(raw["top_k"], "sampling_params.top_k", 1, top)
        except BadRequest as exc:
            raise BadRequest(f"{exc.message} (or -1 to disable top-k)") from None
    if raw.get("seed") is not None:
        integer(raw["seed"], "sampling_params.seed", 0, INT64_MAX)
    _check_stop(raw.get("stop"), vocab_size)


def _check_stop(stop: Any, vocab_size: int | None) -> None:
    if not isinstance(stop, list):
        return  # None or a string; other types are refused by SamplingParams
    if len(stop) > MAX_STOPS:
        raise BadRequest(f"sampling_params.stop has {len(stop)} entries; at most {MAX_STOPS}")
    high = vocab_size - 1 if vocab_size is not None else INT64_MAX
    for index, item in enumerate(stop):
        if isinstance(item, str):
            if not item:
                raise BadRequest(f"sampling_params.stop[{index}] is an empty string")
        elif isinstance(item, int) and not isinstance(item, bool):
            integer(item, f"sampling_params.stop[{index}] (a token id)", 0, high)
