"""Start-up recovery of ``<home>/checkpoints``: the folders and the store agree again after a kill.

A save writes the folder ``<owner>/<run>/<kind>/<name>`` (atomically, through the
library), then records it in the store; a kill can fall anywhere in between. Before the
server takes requests, so that no process writes there:

* every save or overwrite the kill cut short is put right by the library (an overwrite
  rolled back, every temporary folder removed: ``twinkle.model.checkpoint_recovery``);
* a record whose folder is gone or incomplete is dropped;
* a complete folder without a record (the kill fell after the rename, before the record)
  is recorded when its owner key and run are in the store: it is the checkpoint the save was
  writing, whole, and its owner can list, load and delete it. A folder of a known key that
  is incomplete, or whose run the store does not know, can never be reached and would block
  its name, so it is removed. A folder of a key the store does not know is left on disk
  with a warning: the store may have been replaced, and a tenant's data is not deleted on
  that guess.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from twinkle.model.checkpoint import TRAINER_STATE, CheckpointError, read_record
from twinkle.model.checkpoint_recovery import recover_checkpoints
from twinkle.server.names import KINDS
from twinkle.server.store import CheckpointRecord, Store, TrainingRun
from twinkle.utils import get_logger

logger = get_logger()


def run_folder_name(run_id: str) -> str:
    """The folder of a run's checkpoints (``:`` is not portable in file names)."""
    return run_id.replace(":", "_")


def reconcile_checkpoints(store: Store, root: Path) -> None:
    """Make ``root`` (``<home>/checkpoints``) and the store's checkpoint records agree."""
    for kind_folder in root.glob("*/*/*"):
        if kind_folder.is_dir():
            recover_checkpoints(kind_folder, writers_alive=False)
    for record in store.all_checkpoints():
        if not (Path(record.path) / TRAINER_STATE).is_file():
            logger.warning(f"checkpoint {record.path} is gone or incomplete: unlisting it")
            store.delete_checkpoint(record.owner, record.run_id, record.kind, record.name)
    keys = {key.id for key in store.list_keys()}
    for owner_folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name[0] != "."):
        if owner_folder.name not in keys:
            logger.warning(f"{owner_folder} belongs to no key in the store: left as it is")
            continue
        runs = {run_folder_name(run.id): run for run in all_runs(store, owner_folder.name)}
        for run_folder in sorted(p for p in owner_folder.iterdir() if p.is_dir()):
            _reconcile_run(store, owner_folder.name, runs.get(run_folder.name), run_folder)


def all_runs(store: Store, owner: str, page: int = 1000) -> list[TrainingRun]:
    runs: list[TrainingRun] = []
    while True:
        batch, total = store.list_runs(owner, page, len(runs))
        runs += batch
        if not batch or len(runs) >= total:
            return runs


def _reconcile_run(store: Store, owner: str, run: TrainingRun | None, folder: Path) -> None:
    if run is None:
        logger.warning(f"{folder} holds checkpoints of a run the store does not know: removed")
        shutil.rmtree(folder, ignore_errors=True)
        return
    for kind in KINDS:
        for checkpoint in sorted(p for p in (folder / kind).glob("[!.]*") if p.is_dir()):
            if store.get_checkpoint(owner, run.id, kind, checkpoint.name) is None:
                _record_or_remove(store, owner, run.id, kind, checkpoint)


def _record_or_remove(store: Store, owner: str, run_id: str, kind: str, folder: Path) -> None:
    try:
        _, saved = read_record(folder)
    except (CheckpointError, FileNotFoundError) as exc:
        logger.warning(f"removing {folder}, an unrecorded folder that is no checkpoint: {exc}")
        shutil.rmtree(folder, ignore_errors=True)
        return
    logger.warning(f"recording {folder}, saved whole before a kill stopped its recording")
    store.add_checkpoint(
        CheckpointRecord(
            run_id=run_id,
            kind=kind,
            name=folder.name,
            owner=owner,
            path=str(folder),
            size_bytes=sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
            created_at=(folder / TRAINER_STATE).stat().st_mtime,
            has_optimizer=saved.optimizer is not None,
        )
    )
