"""Parse a model or dataset id into where it lives: on disk, in the bundle, or on a hub.

Grammar (first match wins):

- an ``os.PathLike``, or a string naming an existing file or folder (absolute,
  relative or ``~``): a local path. Existing paths are checked first, so a local
  folder called ``org/name`` shadows the hub repo of that name;
- ``bundled://NAME``: a model or dataset shipped with twinkle-data;
- ``ms://org/name[@revision]`` (ModelScope) or ``hf://org/name[@revision]``
  (Hugging Face);
- a bare ``org/name[@revision]``: the default hub, ``ms`` as in the user's
  documents, or whatever ``TWINKLE_DEFAULT_HUB`` (``ms`` or ``hf``) says;
- anything else is treated as a local path that does not exist.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from twinkle.hub.bundled import PREFIX as BUNDLED_PREFIX
from twinkle.hub.bundled import bundled_ids

HUBS = {"ms": "ModelScope", "hf": "Hugging Face"}
DEFAULT_HUB = "ms"
DEFAULT_HUB_ENV = "TWINKLE_DEFAULT_HUB"
KNOWN_PREFIXES = ("ms://", "hf://", BUNDLED_PREFIX)

_PART = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
_REPO = re.compile(f"{_PART}/{_PART}")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class LocalId:
    """A file or folder on disk."""

    path: Path


@dataclass(frozen=True)
class BundledId:
    """A model or dataset shipped inside twinkle-data."""

    name: str


@dataclass(frozen=True)
class HubId:
    """A repo on a hub: ``hub`` is ``'ms'`` or ``'hf'``; ``revision`` None means the default.

    ``bare`` marks an id written without a prefix, which could also have been
    meant as a (missing) relative path; errors mention both readings.
    """

    hub: str
    repo_id: str
    revision: str | None
    bare: bool = False

    def __str__(self) -> str:
        return f"{self.hub}://{self.repo_id}" + (f"@{self.revision}" if self.revision else "")


def default_hub() -> str:
    """The hub a bare ``org/name`` goes to: ``TWINKLE_DEFAULT_HUB`` or ``'ms'``."""
    value = os.environ.get(DEFAULT_HUB_ENV, "").strip().lower() or DEFAULT_HUB
    if value not in HUBS:
        raise ValueError(
            f"{DEFAULT_HUB_ENV}={value!r} is not a hub; set it to one of {', '.join(HUBS)}"
        )
    return value


def parse_id(
    source: str | os.PathLike[str], revision: str | None = None
) -> LocalId | BundledId | HubId:
    """Classify ``source`` (see the module docstring); ``revision`` overrides none, it must agree.

    Raises TypeError for a non-string, ValueError for an unknown prefix, a
    malformed repo id, a revision given twice with different values, or a
    revision on a local or bundled id, and FileNotFoundError for a path that
    does not exist.
    """
    if isinstance(source, os.PathLike):
        return _local(Path(source), source, revision)
    if not isinstance(source, str) or not source.strip():
        raise TypeError(f"a model or dataset id must be a non-empty str or path, got {source!r}")
    text = source.strip()
    scheme = _SCHEME.match(text)
    if scheme is None:
        path = Path(text).expanduser()
        explicit_path = text.startswith(("/", "./", "../", "~")) or text in (".", "..")
        if path.exists() or explicit_path or not _REPO.fullmatch(text.split("@", 1)[0]):
            return _local(path, source, revision)
        return _hub(default_hub(), text, source, revision, bare=True)
    prefix, rest = scheme.group(1).lower(), text[scheme.end() :]
    if prefix == "bundled":
        if revision is not None or "@" in rest:
            raise ValueError(f"{source!r}: bundled ids have no revisions; drop the @revision")
        return BundledId(rest.strip("/"))
    if prefix in HUBS:
        return _hub(prefix, rest, source, revision)
    raise ValueError(
        f"unknown id prefix {prefix + '://'!r} in {source!r}; known prefixes: "
        f"{', '.join(KNOWN_PREFIXES)} (or a local path, or a bare org/name for the default hub)"
    )


def _local(path: Path, source: object, revision: str | None) -> LocalId:
    if revision is not None:
        raise ValueError(f"{source!r} is a local path; a revision applies to hub ids only")
    if not path.exists():
        bundled = [i for i in bundled_ids() if i.removeprefix(BUNDLED_PREFIX) == str(source)]
        hint = (
            f"did you mean {bundled[0]!r}?"
            if bundled
            else "pass an existing file or folder, a hub id (ms://org/name, hf://org/name, "
            f"org/name), or a bundled id ({', '.join(bundled_ids())})"
        )
        raise FileNotFoundError(f"no file or folder at {str(path)!r} (from {source!r}); {hint}")
    return LocalId(path.resolve())


def _hub(hub: str, rest: str, source: str, revision: str | None, bare: bool = False) -> HubId:
    repo_id, _, inline = rest.partition("@")
    if not _REPO.fullmatch(repo_id):
        raise ValueError(
            f"{source!r}: a {HUBS[hub]} repo id has the form org/name "
            f"(letters, digits, '_', '.', '-'; not starting with '.' or '-'), "
            "optionally followed by @revision"
        )
    if "@" in rest and not inline:
        raise ValueError(f"{source!r}: empty revision after '@'")
    if inline and revision is not None and inline != revision:
        raise ValueError(
            f"{source!r} names revision {inline!r} but revision={revision!r} was also passed; "
            "give it once"
        )
    return HubId(hub, repo_id, inline or revision, bare)
