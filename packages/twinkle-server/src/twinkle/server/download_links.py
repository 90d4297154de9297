"""Signed download links: a URL that fetches one checkpoint's archive or exported file
without the API key, until it expires (what Tinker's archive and external-weights URLs
are, so any HTTP client, ``curl`` or ``urllib``, can fetch them).

A link carries what it grants (owner, run, checkpoint, file, expiry) and an HMAC-SHA256 of
that under the server's secret (``<home>/download_secret``, made once, readable by the
server's user only), so it survives restarts and cannot be altered or forged. It grants
what its requester can still read: a checkpoint deleted since, or another key's checkpoint
unpublished since, reads as gone.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from twinkle.server.errors import NotFound

SECRET_FILE = "download_secret"
ARCHIVE = ""
"""The ``file`` of a link to the whole archive."""


@dataclass(frozen=True)
class Grant:
    owner: str
    run_id: str
    kind: str
    name: str
    file: str
    expires_at: float
    reader: str
    """The key the link was made for: another key's checkpoint only while it is published."""


def server_secret(home: Path) -> bytes:
    """The signing key, created on first use (0600; an existing one is kept)."""
    path = home / SECRET_FILE
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes()
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(secrets.token_bytes(32))
    return path.read_bytes()


def sign(secret: bytes, grant: Grant) -> str:
    payload = _b64(json.dumps(asdict(grant), separators=(",", ":")).encode())
    return f"{payload}.{_b64(_mac(secret, payload))}"


def verify(secret: bytes, token: str, now: float | None = None) -> Grant:
    """The grant of a valid, unexpired link; a 404 for anything else (a forged, altered or
    expired link tells nothing about what exists)."""
    payload, _, mac = token.partition(".")
    try:
        valid = hmac.compare_digest(base64.urlsafe_b64decode(_pad(mac)), _mac(secret, payload))
        grant = Grant(**json.loads(base64.urlsafe_b64decode(_pad(payload)))) if valid else None
    except (ValueError, TypeError):
        grant = None
    if grant is None or grant.expires_at <= (time.time() if now is None else now):
        raise NotFound("this download link is invalid or has expired: ask for a new one")
    return grant


def _mac(secret: bytes, payload: str) -> bytes:
    return hmac.new(secret, payload.encode(), hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _pad(text: str) -> str:
    return text + "=" * (-len(text) % 4)
