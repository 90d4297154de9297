"""Where the server keeps its state: a per-user folder, ``$TWINKLE_HOME`` when set."""

from __future__ import annotations

import os
from pathlib import Path


def twinkle_home() -> Path:
    """``$TWINKLE_HOME``, else ``~/.twinkle``; created on first use."""
    home = Path(os.environ.get("TWINKLE_HOME") or Path.home() / ".twinkle").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home
