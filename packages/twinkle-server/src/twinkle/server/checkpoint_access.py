"""Who may read a checkpoint, and for how long it lives.

A checkpoint is its owner's; a published one is also readable by every other key that
names it by path (loading it, sampling from it, downloading it), never writable: only the
owner saves over, publishes, expires or deletes it. An expired checkpoint reads as absent
at once, and the reaper deletes its folder and record soon after.
"""

from __future__ import annotations

import math
import shutil
import time
from datetime import UTC, datetime
from typing import Any

from twinkle.server.auth import Principal
from twinkle.server.errors import BadRequest, NotFound
from twinkle.server.names import CheckpointUri, parse_uri
from twinkle.server.store import CheckpointRecord, Store
from twinkle.utils import get_logger

logger = get_logger()


def live(record: CheckpointRecord | None, now: float | None = None) -> CheckpointRecord | None:
    """``record`` unless it has expired."""
    if record is None or record.expires_at is None:
        return record
    return record if record.expires_at > (time.time() if now is None else now) else None


def owned(store: Store, principal: Principal, uri: CheckpointUri) -> CheckpointRecord:
    """The caller's own checkpoint; 404 for another key's (published or not) or none."""
    record = live(store.get_checkpoint(principal.key_id, uri.run_id, uri.kind, uri.name))
    if record is None:
        raise NotFound(f"no checkpoint {uri}")
    return record


def readable(store: Store, principal: Principal, path: Any) -> CheckpointRecord:
    """The checkpoint ``path`` names if the caller owns it or its owner published it; a
    404 otherwise, exactly like one that does not exist."""
    uri = parse_uri(path)
    record = live(store.get_checkpoint(principal.key_id, uri.run_id, uri.kind, uri.name))
    if record is None:
        record = live(store.public_checkpoint(uri.run_id, uri.kind, uri.name))
    if record is None:
        raise NotFound(f"no checkpoint {uri}")
    return record


def expiry(ttl_seconds: Any, max_ttl_s: int, now: float | None = None) -> float | None:
    """When a checkpoint given ``ttl_seconds`` expires (None: never), the TTL checked to be
    a whole number of seconds in [1, limits.max_checkpoint_ttl_s]."""
    if ttl_seconds is None:
        return None
    bad = isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int | float)
    if not bad:
        bad = not math.isfinite(ttl_seconds) or ttl_seconds != int(ttl_seconds)
    if bad or not 1 <= ttl_seconds <= max_ttl_s:
        raise BadRequest(
            f"ttl_seconds must be a whole number of seconds in [1, {max_ttl_s}] "
            f"(limits.max_checkpoint_ttl_s), or null for no expiry; got {ttl_seconds!r}"
        )
    return (time.time() if now is None else now) + int(ttl_seconds)


def iso(seconds: float | None) -> str | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC).isoformat()


def delete(store: Store, record: CheckpointRecord) -> None:
    """Unlist a checkpoint, then remove its folder (a reader that opened it keeps its files)."""
    store.delete_checkpoint(record.owner, record.run_id, record.kind, record.name)
    shutil.rmtree(record.path, ignore_errors=True)


def reap_expired(store: Store, now: float | None = None) -> int:
    """Delete every checkpoint whose TTL has run out; returns how many."""
    expired = store.expired_checkpoints(time.time() if now is None else now)
    for record in expired:
        logger.info(f"checkpoint {record.run_id}/{record.kind}/{record.name} expired: deleted")
        delete(store, record)
    return len(expired)
