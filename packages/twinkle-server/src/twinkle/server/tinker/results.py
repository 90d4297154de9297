"""Future results that the Tinker SDK may ask for as protobuf.

SDK 0.38 requires forward_backward and sample results as protobuf bytes while 0.16.1 reads
JSON; a future therefore stores both encodings and retrieve_future picks one from the
request's Accept header.

JSON cannot hold NaN or infinities (SDK 0.38 parses with orjson, which refuses them), yet a
loss or a gradient norm may be one. ``json_safe`` writes them as the strings ``"NaN"``,
``"Infinity"`` and ``"-Infinity"``, which the SDKs' pydantic models read back as floats.
"""

from __future__ import annotations

import math
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


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its string spelling."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value
