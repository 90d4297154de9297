"""The ``base_model`` a Tinker request names, checked against the one model this server serves.

Tinker names models by their bare repo id (``Qwen/Qwen3-4B``), and the documents' samples
strip the hub prefix before they pass it (``base_model[len('ms://'):]``), so a server
serving ``ms://Qwen/Qwen3-4B`` takes ``Qwen/Qwen3-4B`` as the same model; any other name
is refused with the one the server takes.
"""

from __future__ import annotations

from twinkle.hub.ids import HubId, parse_id
from twinkle.server.errors import BadRequest


def served_repo_id(served: str) -> str | None:
    """The bare repo id of a served hub model; None for a bundled or local one."""
    try:
        parsed = parse_id(served)
    except (ValueError, FileNotFoundError, TypeError):
        return None
    return parsed.repo_id if isinstance(parsed, HubId) else None


def check_base_model(served: str, asked: str | None, doing: str) -> None:
    """Refuse a ``base_model`` that is not the served model (None: not named, fine)."""
    if asked is None or asked == served or asked == served_repo_id(served):
        return
    raise BadRequest(f"this server {doing} {served!r}, not {asked!r}; pass base_model={served!r}")
