"""A plugin's files, read once: their sha256 and a private copy that is what gets imported.

The digest is the sha256 of the listing ``sha256sum`` prints for every file, sorted by
path, so an operator can compute it for a reviewed checkout with standard tools::

    cd repo && find . -type f ! -path './.git/*' -printf '%P\\0' | LC_ALL=C sort -z \\
        | xargs -0 sha256sum | sha256sum

Left out are the hubs' own bookkeeping, which is not part of the repo (``.git/``,
``.cache/``, ModelScope's ``.mdl``, ``.msc``, ``.mv`` and ``._____temp``). Everything else
is hashed and copied, bytecode included, and Python imports only from the copy: no file
it can reach there was left out of the hash, and a cache changed after hashing is never
read.
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from pathlib import Path

from twinkle.hub.plugin.manifest import PluginError

IGNORED_DIRS = {".git", ".cache", "._____temp"}
IGNORED_ROOT_FILES = {".mdl", ".msc", ".mv"}
MAX_BYTES = 64 * 1024 * 1024
"""A plugin repo holds code and small data; a larger one is most likely a model repo."""


def read_files(folder: Path, source: str) -> dict[str, bytes]:
    """Every file of the repo at ``folder`` by its relative POSIX path, hub bookkeeping left out."""
    files: dict[str, bytes] = {}
    total = 0
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or IGNORED_DIRS.intersection(relative.parts[:-1]):
            continue
        if len(relative.parts) == 1 and relative.name in IGNORED_ROOT_FILES:
            continue
        data = path.read_bytes()
        total += len(data)
        if total > MAX_BYTES:
            raise PluginError(
                f"{source} holds more than {MAX_BYTES // 2**20} MiB of files; a plugin repo "
                "holds code (put weights and data sets in repos of their own)"
            )
        files[relative.as_posix()] = data
    return files


def digest(files: dict[str, bytes]) -> str:
    """The sha256 of the ``sha256sum`` listing of ``files``, sorted by path."""
    listing = "".join(
        f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(files.items())
    )
    return hashlib.sha256(listing.encode("utf-8")).hexdigest()


def private_copy(files: dict[str, bytes], sha256: str) -> Path:
    """A new folder, owned by this process and removed when it exits, holding exactly ``files``."""
    root = Path(tempfile.mkdtemp(prefix=f"twinkle-plugin-{sha256[:12]}-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for name, data in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return root
