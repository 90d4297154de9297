"""Future results that the Tinker SDK may ask for as protobuf.

SDK 0.38 requires forward_backward and sample results as protobuf bytes while 0.16.1 reads
JSON; a future therefore stores both encodings and retrieve_future picks one from the
request's Accept header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PROTO_MEDIA_TYPE = "application/x-protobuf"


@dataclass(frozen=True)
class ProtoResult:
    """One result in both encodings: `proto` (SDK 0.38) and `json` (SDK 0.16.1)."""

    json: dict[str, Any]
    proto: bytes


def wants_proto(accept_header: str | None) -> bool:
    """True when the client's Accept header lists the protobuf media type."""
    return bool(accept_header) and PROTO_MEDIA_TYPE in accept_header.lower()
