"""SamplingSessions: which weights a Tinker sampler id samples from, and whose it is.

A sampler id (``<session>:sample:<seq>``, the form the SDK's docstrings show) names either
the base model, a checkpoint the caller owns (``create_sampling_session(model_path=...)``),
or the folder a training client's ephemeral ``save_weights_for_sampler`` just wrote
(``register``, for ``save_weights_and_get_sampling_client``). Entries live in memory, like
the sampling clients that use them: a restarted server forgets them. The oldest are dropped
past ``MAX_SAMPLERS``, since RL loops make one per step.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass

from twinkle.server.auth import Principal
from twinkle.server.errors import NotFound

MAX_SAMPLERS = 4096


@dataclass(frozen=True)
class SamplerEntry:
    sampler_id: str
    owner: str  # the key id
    session_id: str
    checkpoint_folder: str | None  # None: the base model
    model_path: str | None = None  # the tinker:// path it was created from, if any


class SamplingSessions:
    def __init__(self, max_entries: int = MAX_SAMPLERS) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, SamplerEntry] = OrderedDict()
        self._lock = threading.Lock()

    def register(
        self,
        principal: Principal,
        session_id: str,
        seq: int | None,
        checkpoint_folder: str | None,
        model_path: str | None = None,
    ) -> str:
        """A sampler id for these weights (a fresh one when ``seq`` is None); registering an
        id again points it at the new weights."""
        suffix = seq if seq is not None else "x" + secrets.token_hex(6)
        sampler_id = f"{session_id}:sample:{suffix}"
        entry = SamplerEntry(
            sampler_id, principal.key_id, session_id, checkpoint_folder, model_path
        )
        with self._lock:
            self._entries[sampler_id] = entry
            self._entries.move_to_end(sampler_id)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return sampler_id

    def get(self, principal: Principal, sampler_id: str) -> SamplerEntry:
        """The caller's sampler; another key's is as unknown as a missing one."""
        entry = self._entries.get(sampler_id)
        if entry is None or entry.owner != principal.key_id:
            raise NotFound(
                f"no sampler {sampler_id!r} (sampler ids last until the server restarts; create "
                "a new sampling client)"
            )
        return entry

    def session_sampler_ids(self, principal: Principal, session_id: str) -> list[str]:
        with self._lock:
            return [
                e.sampler_id
                for e in self._entries.values()
                if e.owner == principal.key_id and e.session_id == session_id
            ]
