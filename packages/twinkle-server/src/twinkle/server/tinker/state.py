"""TinkerState: what the Tinker routes share across requests (hung on ServerState.tinker)."""

from __future__ import annotations

from dataclasses import dataclass, field

from twinkle.server.tinker.ordering import SeqOrdering
from twinkle.server.tinker.sampling_sessions import SamplingSessions


@dataclass
class TinkerState:
    ordering: SeqOrdering = field(default_factory=SeqOrdering)
    sampling: SamplingSessions = field(default_factory=SamplingSessions)


def build_tinker_state() -> TinkerState:
    return TinkerState()
