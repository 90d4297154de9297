"""Names a client may choose, and the ``twinkle://<run>/weights/<name>`` checkpoint URIs.

A client never picks a directory: it names a checkpoint, and the server decides where the
checkpoint lives. A name is a short run of letters, digits, ``.``, ``_`` and ``-``, not
starting with a dot, so it can never climb out of its folder or hide as a dotfile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from twinkle.server.errors import BadRequest

NAME = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_-]{0,127}$")
"""Run ids look like ``sess-<hex>:train:<n>``, the scheme the Tinker SDK derives itself."""
SCHEME = "twinkle://"
KINDS = ("weights", "sampler_weights", "external_weights")


def check_name(name: object, what: str = "checkpoint name") -> str:
    if not isinstance(name, str) or not NAME.match(name) or ".." in name:
        raise BadRequest(
            f"invalid {what} {name!r}: use 1-128 letters, digits, '.', '_' or '-', not "
            "starting with '.', with no '..' and no '/'"
        )
    return name


@dataclass(frozen=True)
class CheckpointUri:
    run_id: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.run_id}/{self.kind}/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        return f"{self.kind}/{self.name}"


def parse_uri(uri: object) -> CheckpointUri:
    """Parse ``twinkle://<run>/<kind>/<name>`` (``tinker://`` too), validating each part."""
    if not isinstance(uri, str):
        raise BadRequest(f"a checkpoint path must be a string, got {type(uri).__name__}")
    for scheme in (SCHEME, "tinker://"):
        if uri.startswith(scheme):
            parts = uri[len(scheme) :].split("/")
            break
    else:
        raise BadRequest(
            f"checkpoint path {uri!r} must look like twinkle://<run>/weights/<name>; "
            "server-side directories cannot be named"
        )
    if len(parts) != 3 or not RUN_ID.match(parts[0]) or parts[1] not in KINDS:
        raise BadRequest(f"checkpoint path {uri!r} must look like twinkle://<run>/weights/<name>")
    return CheckpointUri(parts[0], parts[1], check_name(parts[2]))
