"""Checkpoints in and out of the server: download one as a peft folder, publish it, give
it a TTL, push it to a hub repo, and import a peft adapter to train on.

Paths are ``twinkle://<run>/<kind>/<name>`` or the same in ``tinker://`` form, so a Tinker
user's checkpoints go through these too, on the same key. A download lands whole or not
at all: the archive is fetched and unpacked into a private folder first, its members
checked (plain files, no paths), and only then moved into ``output_dir``.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

from twinkle_client.errors import TwinkleClientError
from twinkle_client.http import Transport

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
SCHEMES = ("twinkle://", "tinker://")


def checkpoint_route(path: str) -> str:
    """``/training_runs/<run>/checkpoints/<kind>/<name>`` for a checkpoint's path."""
    for scheme in SCHEMES:
        if isinstance(path, str) and path.startswith(scheme):
            parts = path[len(scheme) :].split("/")
            if len(parts) == 3 and all(parts):
                run, kind, name = (quote(p, safe=":") for p in parts)
                return f"/training_runs/{run}/checkpoints/{kind}/{name}"
    raise TwinkleClientError(
        f"{path!r} is not a checkpoint path: use twinkle://<run>/weights/<name> (or tinker://)"
    )


def download(transport: Transport, path: str, output_dir: str | os.PathLike) -> Path:
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".download-"))
    try:
        with tempfile.TemporaryFile() as archive:
            transport.download(f"{checkpoint_route(path)}/archive", archive)
            archive.seek(0)
            names = _unpack(archive, staging)
        for name in names:
            (staging / name).replace(out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _unpack(archive: Any, folder: Path) -> list[str]:
    try:
        with tarfile.open(fileobj=archive, mode="r:gz") as tar:
            names = []
            for member in tar.getmembers():
                if not member.isfile() or "/" in member.name or member.name in ("", ".", ".."):
                    raise TwinkleClientError(f"the archive holds an unsafe member {member.name!r}")
                with open(folder / member.name, "wb") as target:
                    shutil.copyfileobj(tar.extractfile(member), target)
                names.append(member.name)
            return names
    except tarfile.TarError as exc:
        raise TwinkleClientError(f"the server's archive cannot be read: {exc}") from exc


def pack(folder: str | os.PathLike) -> bytes:
    """A peft adapter folder's two files as a gzipped tar (what the import route takes)."""
    source = Path(folder)
    missing = [name for name in ADAPTER_FILES if not (source / name).is_file()]
    if missing:
        raise TwinkleClientError(f"{source} is not a peft adapter folder: {missing} missing")
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name in ADAPTER_FILES:
            tar.add(source / name, arcname=name)
    return data.getvalue()


def ttl_body(ttl_seconds: int | None) -> dict[str, Any]:
    if ttl_seconds is not None and (
        isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int)
    ):
        raise TypeError(f"ttl_seconds must be an int or None, got {ttl_seconds!r}")
    return {"ttl_seconds": ttl_seconds}
