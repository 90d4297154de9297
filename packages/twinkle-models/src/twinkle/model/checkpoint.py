"""The checkpoint folder: what it holds, how it is written safely, and how it is checked.

A checkpoint is one folder::

    <output_dir>/<name>/
        adapter_config.json, adapter_model.safetensors      a LoRA adapter (peft's layout), or
        config.json, model*.safetensors, tokenizer files    a full Hugging Face model folder
        optimizer.pt, scheduler.pt                          optimizer and lr scheduler state_dicts
        optimizer/                                          or: the optimizer state sharded over
                                                            ranks (torch.distributed.checkpoint)
        rng_state.pt, rng_state.rank<r>.pt                  Python, numpy, torch (and device) RNGs
                                                            of rank 0 (or the one process), rank r
        trainer_state.json                                  counters, versions; written last

It is written into a temporary sibling folder (``.<name>.tmp-<pid>@<host>-*``) and
renamed into place only when complete, so the path ``<name>`` never holds a half-written
checkpoint. Saving again under the same name renames the old folder aside
(``.<name>.old-<pid>@<host>-*``), the new one into place, then deletes the old: at every
moment a complete checkpoint exists under ``<name>`` or its aside name. A process killed
in between leaves these siblings behind; the next save or load of that name (or
``recover_checkpoints`` on the whole folder) puts them right (``checkpoint_recovery``).
``trainer_state.json`` is the completeness marker: it is written last and says
``"complete": true``; a folder without it (a copy cut short, a crashed save's leftover)
is refused.

``.pt`` files are torch state_dicts of tensors and plain values, read back with
``torch.load(weights_only=True)``, which never unpickles arbitrary objects.

Under torchrun, rank 0 writes the weights (gathered from the shards into one Hugging
Face / peft folder), the scheduler and the record; with FSDP every rank writes its shard
of the optimizer state into ``optimizer/``, which resumes on a mesh of as many ranks;
each rank writes its random states.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from twinkle.model.checkpoint_recovery import (
    pause_point,
    recover_checkpoint,
    recover_checkpoints,
    writer_tag,
)

TRAINER_STATE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
RNG_FILE = "rng_state.pt"
OPTIMIZER_DIR = "optimizer"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
FORMAT_VERSION = 1
KINDS = ("adapter", "full")
VERSIONED = (
    "twinkle-mesh",
    "twinkle-data",
    "twinkle-models",
    "torch",
    "transformers",
    "peft",
    "safetensors",
    "numpy",
)


class CheckpointError(ValueError):
    """A folder that is not a complete, readable checkpoint."""


@dataclass
class CheckpointRecord:
    """The contents of ``trainer_state.json``.

    ``step`` counts optimizer steps and ``accumulated_calls`` the
    ``clip_grad_and_step`` calls (batches) of the trainable unit; ``adapter_name``
    and ``adapter_config`` (peft's LoRA config as JSON) are None for a full model.
    ``optimizer`` and ``lr_scheduler`` are the class names whose state_dicts the
    folder holds, None when it holds none. ``optimizer_ranks`` is the number of ranks
    an optimizer state sharded by FSDP was saved from (in ``optimizer/``); None when
    it is one ``optimizer.pt``. ``optimizer_mesh`` names the mesh those ranks formed
    (``pp=2 × tp=2``): under pipeline parallel the shards follow the stages, so a
    resume there needs the same mesh.
    """

    kind: str
    step: int
    accumulated_calls: int
    gradient_accumulation_steps: int
    consumed_train_samples: int | None = None
    adapter_name: str | None = None
    adapter_config: dict[str, Any] | None = None
    optimizer: str | None = None
    lr_scheduler: str | None = None
    optimizer_ranks: int | None = None
    optimizer_mesh: str | None = None
    model_id: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    complete: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n"


def library_versions() -> dict[str, str | None]:
    """The installed versions of the libraries a checkpoint's contents depend on."""
    versions: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def rng_file(rank: int) -> str:
    """Rank 0's (or the one process's) random states go to RNG_FILE, rank r's beside it."""
    return RNG_FILE if rank == 0 else f"rng_state.rank{rank}.pt"


def check_name(name: str) -> str:
    """A checkpoint name is one folder name: no separators, no '..', no leading dot."""
    if (
        not isinstance(name, str)
        or not name
        or name.startswith(".")
        or "/" in name
        or "\\" in name
        or "\0" in name
    ):
        raise ValueError(
            f"checkpoint name {name!r} must be a plain folder name (no '/', '\\', or leading "
            f"'.'); put the parent folders in output_dir="
        )
    return name


def check_consumed_train_samples(value: int | None) -> int | None:
    """``save(consumed_train_samples=...)`` is a non-negative int, or None when unknown."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(
            f"consumed_train_samples must be a non-negative int or None, got {value!r}"
        )
    return value


# ---- writing ---------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_folder(
    final: str | os.PathLike, *, marker: str, overwrite: bool = True
) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``final``; rename it to ``final`` on success.

    On an exception the temporary folder is deleted and ``final`` is untouched; what a
    killed write left beside it is put right first (``checkpoint_recovery``). An
    existing ``final`` is replaced only with ``overwrite`` and only when it is empty
    or holds ``marker`` (a folder of the kind being written), so a mistyped path never
    deletes unrelated files.
    """
    final = Path(final).absolute()
    recover_checkpoints(final.parent)  # what dead writers left, of any name there
    if final.exists() and not overwrite:
        raise FileExistsError(f"{final} already exists; pass overwrite=True or choose a new name")
    if final.exists() and (
        not final.is_dir() or (any(final.iterdir()) and not (final / marker).is_file())
    ):
        raise FileExistsError(
            f"{final} exists and does not hold {marker}, so it is not a folder this writes; "
            f"refusing to replace it: choose another path or remove it"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{writer_tag()}-", dir=final.parent))
    try:
        yield tmp
        _fsync_tree(tmp)
        pause_point("written", final)
        _rename_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def shared_atomic_folder(
    final: Path, *, marker: str, overwrite: bool, distributed: bool
) -> Iterator[tuple[Path, bool]]:
    """``atomic_folder`` for every rank: rank 0 makes the temporary folder and tells the
    others its path; it renames it into place once all ranks have written. Yields the folder
    and whether this rank is the one that writes the shared files."""
    if not distributed:
        with atomic_folder(final, marker=marker, overwrite=overwrite) as folder:
            yield folder, True
        return
    if dist.get_rank() != 0:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            raise RuntimeError(f"rank 0 could not create the checkpoint folder {final}: see rank 0")
        yield Path(box[0]), False
        dist.barrier()  # every rank has written
        dist.barrier()  # rank 0 has renamed the folder into place
        return
    with contextlib.ExitStack() as stack:
        try:
            folder = stack.enter_context(atomic_folder(final, marker=marker, overwrite=overwrite))
        except BaseException:
            dist.broadcast_object_list([None], src=0)
            raise
        dist.broadcast_object_list([str(folder)], src=0)
        yield folder, True
        dist.barrier()
    dist.barrier()


def _rename_into_place(tmp: Path, final: Path) -> None:
    aside = None
    if final.exists():
        aside = final.with_name(f".{final.name}.old-{writer_tag()}-{uuid.uuid4().hex[:8]}")
        os.rename(final, aside)
        pause_point("aside", final)
    try:
        os.rename(tmp, final)
    except BaseException:
        if aside is not None:
            os.rename(aside, final)
        raise
    _fsync_dir(final.parent)
    if aside is not None:
        pause_point("placed", final)
        shutil.rmtree(aside)


def _fsync_tree(folder: Path) -> None:
    """Flush the files to disk before the rename publishes them (a crash then loses nothing)."""
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_record(folder: Path, record: CheckpointRecord) -> None:
    """Write ``trainer_state.json``: call it last, it marks the folder complete."""
    (folder / TRAINER_STATE).write_text(record.to_json(), encoding="utf-8")


# ---- reading ---------------------------------------------------------------------------------


def load_state_dict(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path} cannot be read as a torch state_dict: {exc}") from exc


def read_record(path: str | os.PathLike) -> tuple[Path, CheckpointRecord]:
    """The checkpoint folder and its record, after checking that every file it needs is there.

    Raises FileNotFoundError when the folder does not exist and CheckpointError
    when it is incomplete (an interrupted save, a partial copy) or not a checkpoint.
    """
    folder = Path(path).expanduser().absolute()
    recover_checkpoint(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no checkpoint at {folder}: {_missing_folder_hint(folder)}")
    marker = folder / TRAINER_STATE
    if not marker.is_file():
        raise CheckpointError(
            f"{folder} is not a complete checkpoint: {TRAINER_STATE}, which save() writes last, "
            f"is missing (the save was interrupted or the folder was copied partly). Resume from "
            f"another checkpoint; to add a plain peft adapter folder use add_adapter_to_model, "
            f"and to load a Hugging Face model folder pass it as model_id"
        )
    try:
        raw = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{marker} cannot be read: {exc}") from exc
    record = _record_from(raw, marker)
    missing = [name for name in required_files(folder, record) if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(
            f"{folder} is not a complete checkpoint: {', '.join(missing)} missing"
        )
    return folder, record


def _missing_folder_hint(folder: Path) -> str:
    if not folder.parent.is_dir():
        return f"the folder does not exist, nor does its parent {folder.parent}"
    found = sorted(
        p.name for p in folder.parent.iterdir() if p.is_dir() and (p / TRAINER_STATE).is_file()
    )
    listing = ", ".join(found) if found else "none"
    return f"the folder does not exist; checkpoints in {folder.parent}: {listing}"


def _record_from(raw: Any, marker: Path) -> CheckpointRecord:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{marker} does not hold a JSON object")
    version = raw.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{marker} has format version {version!r}, which this twinkle-models does not read "
            f"(it reads up to {FORMAT_VERSION}); upgrade twinkle-models"
        )
    unknown = sorted(set(raw) - {f.name for f in fields(CheckpointRecord)})
    if unknown:
        raise CheckpointError(f"{marker} is not a twinkle trainer state (unknown: {unknown})")
    try:
        record = CheckpointRecord(**raw)
    except TypeError as exc:
        raise CheckpointError(f"{marker} is missing fields: {exc}") from exc
    if record.complete is not True:
        raise CheckpointError(f"{marker} does not mark the checkpoint complete")
    if record.kind not in KINDS:
        raise CheckpointError(f"{marker}: kind {record.kind!r} is not one of {KINDS}")
    counters = ("step", "accumulated_calls", "gradient_accumulation_steps")
    for name in counters:
        value = getattr(record, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(f"{marker}: {name} must be a non-negative int, got {value!r}")
    consumed = record.consumed_train_samples
    if consumed is not None and (not isinstance(consumed, int) or consumed < 0):
        raise CheckpointError(f"{marker}: consumed_train_samples must be None or an int >= 0")
    return record


def required_files(folder: Path, record: CheckpointRecord) -> list[str]:
    """The files a checkpoint of this record cannot be used without."""
    names = [RNG_FILE]
    if record.optimizer:
        sharded = record.optimizer_ranks is not None
        names += [f"{OPTIMIZER_DIR}/.metadata" if sharded else OPTIMIZER_FILE]
    names += [SCHEDULER_FILE] if record.lr_scheduler else []
    if record.kind == "adapter":
        return [*ADAPTER_FILES, *names]
    return ["config.json", *full_weight_files(folder), *names]


def full_weight_files(folder: Path) -> list[str]:
    """The safetensors files of a full model folder: one file, or the shards its index lists."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return ["model.safetensors"]
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{index} cannot be read: {exc}") from exc
    return sorted(set(weight_map.values()))
