"""Sessions: a client's connection, kept alive by heartbeats; its runs hold LoRA slots.

When a session stops beating for ``session_ttl_s`` (or finishes), its runs release their
slots. Nothing is saved on the way out: a tenant's checkpoints are the ones it asked for.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from twinkle.server.auth import Principal
from twinkle.server.errors import ApiError, NotFound
from twinkle.server.store import SessionRecord, Store
from twinkle.utils import get_logger

logger = get_logger()


class SessionGone(ApiError):
    status, code = 410, "session_finished"


class SessionManager:
    def __init__(self, store: Store, ttl_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s

    def create(self, principal: Principal, metadata: dict[str, Any]) -> SessionRecord:
        now = time.time()
        session = SessionRecord(
            id="sess-" + secrets.token_hex(8),
            owner=principal.key_id,
            created_at=now,
            last_heartbeat=now,
            metadata=metadata,
        )
        self.store.add_session(session)
        return session

    def get_open(self, principal: Principal, session_id: Any) -> SessionRecord:
        if not isinstance(session_id, str):
            raise NotFound("session_id must be a string")
        session = self.store.get_session(principal.key_id, session_id)
        if session is None:
            raise NotFound(f"no session {session_id!r}")
        if session.closed_at is not None:
            raise SessionGone(f"session {session_id} has finished; create a new one")
        return session

    def heartbeat(self, principal: Principal, session_id: Any) -> None:
        self.get_open(principal, session_id)
        self.store.touch_session(principal.key_id, session_id, time.time())

    def expired(self) -> list[SessionRecord]:
        return self.store.expired_sessions(time.time() - self.ttl_s)
