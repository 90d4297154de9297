"""When a completion ends: a stop token (the end-of-turn token, or ids in ``stop``), a stop
string appearing in the decoded text, or ``max_tokens``.

As vLLM does: a stop token stays in the tokens (the model learns to emit it) and out of the
text; a stop string stays in the tokens that produced it and is cut from the text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from twinkle.data_format import SamplingParams


@dataclass(frozen=True)
class StopRule:
    token_ids: frozenset[int]
    strings: tuple[str, ...]

    @classmethod
    def build(cls, params: SamplingParams, eos_token_ids: Iterable[int]) -> StopRule:
        stop = params.stop
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        strings = tuple(s for s in stop if isinstance(s, str))
        if any(not s for s in strings):
            raise ValueError("stop strings must not be empty")
        ids = {i for i in stop if isinstance(i, int)} | set(eos_token_ids)
        return cls(frozenset(ids), strings)

    @property
    def tail_tokens(self) -> int:
        """How many trailing tokens to decode to see a stop string just completed: every
        token decodes to at least one character, plus slack for partial UTF-8 bytes."""
        return max((len(s) for s in self.strings), default=0) + 4

    def stops_at_token(self, token: int) -> bool:
        return token in self.token_ids

    def stops_in_text(self, tokens: Sequence[int], decode: Callable[[list[int]], str]) -> bool:
        if not self.strings:
            return False
        tail = decode(list(tokens[-self.tail_tokens :]))
        return any(s in tail for s in self.strings)

    def cut_text(self, text: str) -> str:
        """The text before the first stop string (all of it when none occurs)."""
        cut = min((i for i in (text.find(s) for s in self.strings) if i >= 0), default=len(text))
        return text[:cut]
