"""Rank-aware logging: one voice for progress messages, every rank for problems.

Under torchrun or Ray every process runs the same loop, so INFO and DEBUG
lines are shown from rank 0 only (``TWINKLE_LOG_RANKS=all`` or ``=0,3`` to
change that), while WARNING and above are shown from every rank, because a
problem on rank 5 must not be hidden. ``TWINKLE_LOG_LEVEL`` (DEBUG, INFO, ...)
sets the level when a logger family is first configured. Each line shows the
rank it came from.
"""

from __future__ import annotations

import logging
import os
import sys

from twinkle.mesh import Platform

_FORMAT = "[%(asctime)s] [rank %(rank)s] %(levelname)s %(name)s: %(message)s"


def _info_ranks() -> set[int] | None:
    """The ranks that show INFO/DEBUG; None means every rank."""
    value = os.environ.get("TWINKLE_LOG_RANKS", "0").strip()
    if value.lower() == "all":
        return None
    try:
        return {int(part) for part in value.split(",") if part.strip()}
    except ValueError:
        raise ValueError(
            f"TWINKLE_LOG_RANKS={value!r}: use 'all' or comma-separated ranks such as '0,3'"
        ) from None


def _level_from_env() -> int:
    name = os.environ.get("TWINKLE_LOG_LEVEL", "INFO").strip().upper()
    levels = logging.getLevelNamesMapping()
    if name not in levels:
        known = ", ".join(n for n in levels if n != "NOTSET")
        raise ValueError(f"TWINKLE_LOG_LEVEL={name!r} is not a logging level; use one of {known}")
    return levels[name]


class RankFilter(logging.Filter):
    """Stamps each record with its rank; drops INFO/DEBUG from ranks not asked for."""

    def filter(self, record: logging.LogRecord) -> bool:
        rank = Platform.get_rank()
        record.rank = rank
        if record.levelno >= logging.WARNING:
            return True
        ranks = _info_ranks()
        return ranks is None or rank in ranks


class _StderrHandler(logging.StreamHandler):
    """Writes to the current ``sys.stderr``, so later redirection (and pytest) sees the lines."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


def get_logger(name: str = "twinkle") -> logging.Logger:
    """The logger ``name``; its top-level family (``twinkle`` for ``twinkle.model``) gets a
    rank-aware stderr handler the first time, and stops propagating to the root logger so
    that a user's ``logging.basicConfig`` does not print every line twice."""
    logger = logging.getLogger(name)
    family = logging.getLogger(name.split(".")[0])
    if not any(isinstance(h, _StderrHandler) for h in family.handlers):
        handler = _StderrHandler()
        handler.addFilter(RankFilter())
        handler.setFormatter(logging.Formatter(_FORMAT))
        family.addHandler(handler)
        family.setLevel(_level_from_env())
        family.propagate = False
    return logger
