"""Sessions: a client's connection, kept alive by heartbeats; its runs hold LoRA slots.

A session whose client said how often it beats (the Tinker SDK always beats every 10 s; a
client may declare ``heartbeat_interval_s``) is released ``session_heartbeat_grace_s``
after a beat it missed, so a script that ends without ``close()`` frees its slots within
seconds; any other session is released after ``session_ttl_s`` of silence. Finishing
releases at once. Nothing is saved on the way out: a tenant's checkpoints are the ones it
asked for.
"""

from __future__ import annotations

import math
import secrets
import time
from typing import Any

from twinkle.server.auth import Principal
from twinkle.server.errors import ApiError, BadRequest, NotFound
from twinkle.server.store import SessionRecord, Store
from twinkle.utils import get_logger

logger = get_logger()
REAP_INTERVAL_S = 5.0
"""How often the server looks for sessions to release (so a release lands up to this late)."""
TINKER_SDK_HEARTBEAT_S = 10.0
"""``SESSION_HEARTBEAT_PERIOD_SEC`` of the Tinker SDK (0.16 and 0.38), which names itself by
the ``sdk_version`` of its create_session."""


class SessionGone(ApiError):
    status, code = 410, "session_finished"


def declared_heartbeat(body: dict[str, Any]) -> float | None:
    """The heartbeat period a create_session body declares (seconds), if any."""
    interval = body.get("heartbeat_interval_s")
    if interval is None:
        return TINKER_SDK_HEARTBEAT_S if "sdk_version" in body else None
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
        raise BadRequest(
            f"heartbeat_interval_s must be a positive number of seconds, got {interval!r}"
        )
    return float(interval)


class SessionManager:
    def __init__(self, store: Store, ttl_s: float, grace_s: float) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.grace_s = grace_s
        # Declared heartbeat periods, by session id. In memory: no adapter outlives the
        # process, so after a restart a session only needs the TTL to end.
        self._periods: dict[str, float] = {}

    def create(
        self,
        principal: Principal,
        metadata: dict[str, Any],
        heartbeat_interval_s: float | None = None,
    ) -> SessionRecord:
        now = time.time()
        session = SessionRecord(
            id="sess-" + secrets.token_hex(8),
            owner=principal.key_id,
            created_at=now,
            last_heartbeat=now,
            metadata=metadata,
        )
        self.store.add_session(session)
        if heartbeat_interval_s is not None:
            self._periods[session.id] = heartbeat_interval_s
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

    def close(self, session_id: str) -> None:
        self.store.close_session(session_id, time.time())
        self._periods.pop(session_id, None)

    def allowed_silence(self, session_id: str) -> float:
        """Seconds without a heartbeat after which the session is released."""
        period = self._periods.get(session_id)
        return self.ttl_s if period is None else min(self.ttl_s, period + self.grace_s)

    def expired(self) -> list[SessionRecord]:
        now = time.time()
        shortest = min([self.ttl_s, *(p + self.grace_s for p in self._periods.values())])
        overdue = self.store.expired_sessions(now - shortest)
        return [s for s in overdue if s.last_heartbeat + self.allowed_silence(s.id) < now]

    def when_a_slot_frees(self, holders: list[tuple[str, str]]) -> str:
        """What a caller refused a LoRA slot is told, from the ``(owner, session_id)`` of
        every slot's run: when the first of those sessions is due to be released. Names no
        session (they may be other tenants')."""
        now = time.time()
        due: list[tuple[float, SessionRecord]] = []
        for owner, session_id in set(holders):
            session = self.store.get_session(owner, session_id)
            if session is None or session.closed_at is not None:
                return "a finished session's slot is being freed now; try again in a few seconds"
            due.append((session.last_heartbeat + self.allowed_silence(session.id), session))
        if not due:
            return "try again later"
        release_at, session = min(due, key=lambda item: item[0])
        wait = max(0, math.ceil(release_at - now + REAP_INTERVAL_S))
        period = self._periods.get(session.id)
        if period is not None and now - session.last_heartbeat > period:
            return f"a session that stopped heartbeating frees one within {wait} s; try again then"
        return (
            "the sessions holding them are alive: a slot frees when one finishes, or "
            f"{self.allowed_silence(session.id):.0f} s after its client stops heartbeating "
            f"(within {wait} s at the earliest); try again later"
        )
