"""Putting right what a killed checkpoint write left behind, without touching a live one's.

``atomic_folder`` writes ``<name>`` through two kinds of siblings, each named after the
process that made it (``<pid>@<host>``)::

    .<name>.tmp-<pid>@<host>-<random>    the new checkpoint being written
    .<name>.old-<pid>@<host>-<random>    the previous ``<name>``, moved aside during an overwrite

A SIGKILL can leave either behind at any instant. Recovery of ``<name>``:

* a stale ``.old-*`` while ``<name>`` is missing (the kill fell between the overwrite's two
  renames) is renamed back to ``<name>``: the overwrite is rolled back. The save never
  returned, so nobody was told of the new checkpoint, while the old one was complete and
  acknowledged; it is kept rather than the new one, whose other ranks' files nothing vouches
  for. A stale ``.old-*`` beside an existing ``<name>`` (the kill fell after the new folder
  was in place, or during the old one's deletion) is deleted;
* a stale ``.tmp-*`` (a save killed while writing, or before its rename) is deleted.

Stale means the writer that made it is dead: its host is this host and its pid is not a
running process (a zombie counts as dead). A sibling made by a live process (a save in
progress, here or in another process) or on another host, whose processes this one cannot
see, is left alone, as is an unmarked one (made before writers were named); a reused pid only makes
recovery keep a leftover longer, never delete a live one. ``writers_alive=False`` (for a
caller that knows no process writes there, such as the server at start-up, before its
workers take requests) treats every sibling as stale.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

from twinkle.utils import get_logger

logger = get_logger()

PAUSE_ENV = "TWINKLE_CHECKPOINT_PAUSE_AT"
# ``.<name>.<kind>-[<pid>@<host>-]<random>``: earlier saves did not name their writer.
LEFTOVER = re.compile(
    r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?:(?P<pid>\d+)@(?P<host>[^-]+)-)?[^-]+$"
)


def writer_tag() -> str:
    """``<pid>@<host>`` of this process, as it appears in the siblings' names."""
    host = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())[:40] or "host"
    return f"{os.getpid()}@{host}"


def pause_point(point: str, final: Path) -> None:
    """A test hook: with ``TWINKLE_CHECKPOINT_PAUSE_AT=<point>:<name>`` the write of the
    checkpoint ``<name>`` stops here for good, so that a kill test's SIGKILL lands exactly in
    this window. It says so on stderr."""
    if os.environ.get(PAUSE_ENV) != f"{point}:{final.name}":
        return
    print(f"TWINKLE_PAUSED {point} {final}", file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)


def recover_checkpoint(final: str | os.PathLike, *, writers_alive: bool = True) -> None:
    """Roll back an overwrite of ``final`` cut short and delete its stale temporary siblings.

    Safe to run from several processes at once: a sibling another one has just moved or
    deleted is skipped.
    """
    final = Path(final).absolute()
    if not final.parent.is_dir():
        return
    stale = [
        path
        for path in final.parent.iterdir()
        if _leftover_of(path) == final.name and (not writers_alive or _writer_dead(path))
    ]
    if not final.exists():
        # An aside folder is a whole former ``final``: its deletion starts only once its
        # replacement is in place. Of several (never made by one save), the newest.
        asides = [path for path in stale if LEFTOVER.match(path.name)["kind"] == "old"]
        for aside in sorted(asides, key=_mtime, reverse=True):
            if _rename(aside, final):
                logger.warning(f"rolled back an interrupted overwrite of {final}")
                break
    for path in stale:
        if path.exists():
            logger.warning(f"removing {path}, left by a checkpoint write that was killed")
            shutil.rmtree(path, ignore_errors=True)


def recover_checkpoints(output_dir: str | os.PathLike, *, writers_alive: bool = True) -> None:
    """``recover_checkpoint`` for every name in ``output_dir`` that has leftover siblings."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return
    names = {name for path in folder.iterdir() if (name := _leftover_of(path)) is not None}
    for name in sorted(names):
        recover_checkpoint(folder / name, writers_alive=writers_alive)


def _leftover_of(path: Path) -> str | None:
    """The checkpoint name whose write left the sibling ``path``, else None."""
    match = LEFTOVER.match(path.name)
    return None if match is None else match["name"]


def _writer_dead(path: Path) -> bool:
    match = LEFTOVER.match(path.name)
    if match["pid"] is None or match["host"] != writer_tag().split("@", 1)[1]:
        return False  # unmarked, or made on another host: its writer cannot be seen
    return not _running(int(match["pid"]))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: the signal said it exists
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _rename(source: Path, target: Path) -> bool:
    try:
        os.rename(source, target)
    except OSError:
        return False  # another process recovered it first
    return True


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
