"""A checkpoint's peft files as one consistent version, and the gzipped tar of them.

A checkpoint folder is only ever replaced whole (a save writes a temporary folder and
renames it into place; an overwrite renames the old one aside and deletes it), so a
reader that opens the folder and then every file through that one directory handle holds
one complete version, old or new, however a concurrent save moves folders around: the
open files outlive the rename and the delete. What leaves the server is therefore always
a whole checkpoint, never half of one (nor a mix of two).

What leaves is a plain peft adapter folder: ``adapter_config.json`` (its
``base_model_name_or_path`` set to the model's public name instead of a server path) and
``adapter_model.safetensors``; plain ``PeftModel.from_pretrained(base, folder)`` loads it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from twinkle.model.checkpoint import ADAPTER_FILES, TRAINER_STATE
from twinkle.server.errors import Conflict

ATTEMPTS = 3
CHUNK = 1024 * 1024


@contextlib.contextmanager
def open_version(
    folder: str | os.PathLike, names: tuple[str, ...]
) -> Iterator[dict[str, BinaryIO]]:
    """Every file of ``names`` (and the completeness marker) of one version of ``folder``,
    open for reading. A version deleted between opening the folder and its files is retried
    from the folder's new contents; a folder that is never complete is a 409."""
    for _ in range(ATTEMPTS):
        opened: dict[str, BinaryIO] = {}
        try:
            directory = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            break
        try:
            for name in (TRAINER_STATE, *names):
                opened[name] = os.fdopen(os.open(name, os.O_RDONLY, dir_fd=directory), "rb")
        except FileNotFoundError:
            for handle in opened.values():
                handle.close()
            continue
        finally:
            os.close(directory)
        try:
            yield opened
        finally:
            for handle in opened.values():
                handle.close()
        return
    raise Conflict(
        f"checkpoint {Path(folder).name} is being written or removed: retry when its save ends"
    )


def peft_config(raw: bytes, base_model: str) -> bytes:
    """``adapter_config.json`` naming ``base_model`` (the served model's public id)."""
    config = json.loads(raw)
    config["base_model_name_or_path"] = base_model
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()


def export_files(folder: str | os.PathLike, base_model: str, out: Path) -> list[str]:
    """Write the checkpoint's peft files (one consistent version) into ``out``; their names."""
    out.mkdir(parents=True, exist_ok=True)
    with open_version(folder, ADAPTER_FILES) as files:
        config, weights = (files[name] for name in ADAPTER_FILES)
        (out / ADAPTER_FILES[0]).write_bytes(peft_config(config.read(), base_model))
        with open(out / ADAPTER_FILES[1], "wb") as target:
            shutil.copyfileobj(weights, target, CHUNK)
    return list(ADAPTER_FILES)


def build_archive(folder: str | os.PathLike, base_model: str) -> BinaryIO:
    """The gzipped tar of the checkpoint's peft files (at the archive's root), in a
    temporary file rewound to its start: built whole before a byte is sent."""
    archive = tempfile.TemporaryFile()  # noqa: SIM115 (the caller streams and closes it)
    try:
        with (
            open_version(folder, ADAPTER_FILES) as files,
            tarfile.open(fileobj=archive, mode="w:gz") as tar,
        ):
            config = peft_config(files[ADAPTER_FILES[0]].read(), base_model)
            _add(tar, ADAPTER_FILES[0], io.BytesIO(config), len(config))
            weights = files[ADAPTER_FILES[1]]
            _add(tar, ADAPTER_FILES[1], weights, os.fstat(weights.fileno()).st_size)
    except BaseException:
        archive.close()
        raise
    archive.seek(0)
    return archive


def stream(handle: BinaryIO) -> Iterator[bytes]:
    """A file's bytes in chunks, closing it at the end (a response body)."""
    try:
        while chunk := handle.read(CHUNK):
            yield chunk
    finally:
        handle.close()


def _add(tar: tarfile.TarFile, name: str, handle: BinaryIO, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, int(time.time())
    tar.addfile(info, handle)
