"""The models and datasets shipped inside twinkle-data, addressed as ``bundled://NAME``.

They live next to this file: ``bundled/models/NAME/`` and ``bundled/datasets/NAME/``.
The names are read from those folders, so adding one needs no code change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

BUNDLED_ROOT = Path(__file__).parent / "bundled"
PREFIX = "bundled://"

Kind = Literal["model", "dataset"]


def bundled_names(kind: Kind) -> list[str]:
    """The bundled model or dataset names, sorted (``['tiny-qwen3']`` for models)."""
    folder = BUNDLED_ROOT / f"{kind}s"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("_"))


def bundled_ids(kind: Kind | None = None) -> list[str]:
    """Every bundled id of one kind, or of both when ``kind`` is None: ``['bundled://gsm8k', ...]``.

    Any of these can be passed wherever a hub id is accepted.
    """
    kinds: list[Kind] = ["model", "dataset"] if kind is None else [kind]
    return [PREFIX + name for k in kinds for name in bundled_names(k)]


def bundled_path(name: str, kind: Kind) -> Path:
    """The folder of bundled model or dataset ``name``.

    Raises ValueError listing the known names when ``name`` is not bundled, and
    pointing at the other resolver when ``name`` is bundled as the other kind.
    """
    if name in bundled_names(kind):
        return BUNDLED_ROOT / f"{kind}s" / name
    other: Kind = "dataset" if kind == "model" else "model"
    if name in bundled_names(other):
        raise ValueError(
            f"{PREFIX}{name} is a bundled {other}, not a {kind}: "
            f"pass it to resolve_{other}() / where a {other} id is expected"
        )
    known = ", ".join(bundled_ids(kind)) or "(none)"
    raise ValueError(f"unknown bundled {kind} {PREFIX}{name}; the bundled {kind}s are: {known}")
