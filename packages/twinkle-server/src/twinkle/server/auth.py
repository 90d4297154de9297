"""API keys: issued by the admin command, stored hashed, checked on every request.

A key is ``tml-`` plus 32 random url-safe bytes (the form the Tinker SDK accepts). Only
its SHA-256 is stored: the key holds 256 bits of randomness, so a fast hash is enough
(a slow password hash guards guessable secrets, which these are not). The key id, not the
key, owns the tenant's records.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from twinkle.server.errors import Unauthorized
from twinkle.server.store import ApiKey, Store

PREFIX = "tml-"


@dataclass(frozen=True)
class Principal:
    """Who made a request: the key id owns every resource the request creates."""

    key_id: str
    name: str


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def create_key(store: Store, name: str) -> tuple[str, ApiKey]:
    """A new key (returned once, never stored) and its record."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("a key needs a non-empty --name")
    key = PREFIX + secrets.token_urlsafe(32)
    record = ApiKey(
        id="key-" + secrets.token_hex(8), name=name, key_hash=hash_key(key), created_at=time.time()
    )
    store.add_key(record)
    return key, record


def authenticate(store: Store, key: str | None) -> Principal:
    """The principal of a presented key; 401 for a missing, unknown or revoked key."""
    if not key:
        raise Unauthorized("missing API key: send it in the X-API-Key header")
    if not key.startswith(PREFIX):
        raise Unauthorized("invalid API key: keys look like tml-...")
    record = store.key_by_hash(hash_key(key))
    if record is None or not hmac.compare_digest(record.key_hash, hash_key(key)):
        raise Unauthorized("invalid API key")
    if record.revoked_at is not None:
        raise Unauthorized("this API key was revoked; ask the operator for a new one")
    return Principal(key_id=record.id, name=record.name)
