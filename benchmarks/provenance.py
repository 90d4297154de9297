"""Where a benchmark figure came from: the commit measured (RESULTS.md rows name it)."""

from __future__ import annotations

import subprocess


def commit() -> str:
    """The short hash of HEAD, 'uncommitted' outside a git checkout, 'unknown' without git."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "uncommitted"
