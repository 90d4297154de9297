"""A checkpoint save killed at any instant is recovered by the next load (or save): an
overwrite cut short is rolled back or completed, temporary folders go, and a live
writer's folders are never touched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from twinkle.model.checkpoint import TRAINER_STATE, CheckpointError, read_record
from twinkle.model.checkpoint_recovery import recover_checkpoints, writer_tag

SCRIPT = Path(__file__).parent / "scripts" / "checkpoint_crash.py"
HOST = writer_tag().split("@", 1)[1]


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def fake_checkpoint(folder: Path, content: str) -> Path:
    folder.mkdir(parents=True)
    (folder / TRAINER_STATE).write_text("{}")
    (folder / "weights").write_text(content)
    return folder


# ---- the rule: what recovery removes, restores and leaves alone ----------------------------


def test_a_dead_writers_leftovers_go_and_a_live_writers_stay(tmp_path):
    dead, live = f"{dead_pid()}@{HOST}", f"{os.getpid()}@{HOST}"
    fake_checkpoint(tmp_path / "a", "a")
    stale = fake_checkpoint(tmp_path / f".a.tmp-{dead}-x1", "new a")
    writing = fake_checkpoint(tmp_path / f".b.tmp-{live}-x2", "b in progress")
    elsewhere = fake_checkpoint(tmp_path / f".c.tmp-{dead.split('@')[0]}@otherhost-x3", "c")
    legacy = fake_checkpoint(tmp_path / ".d.tmp-abc123", "d")  # unmarked: not judged
    recover_checkpoints(tmp_path)
    assert not stale.exists()
    assert writing.exists() and elsewhere.exists() and legacy.exists()
    assert (tmp_path / "a" / "weights").read_text() == "a"
    # A caller that knows nobody writes there (the server at start-up) takes every marked one.
    recover_checkpoints(tmp_path, writers_alive=False)
    assert sorted(os.listdir(tmp_path)) == ["a"]


def test_an_overwrite_cut_between_its_renames_is_rolled_back_on_load(tmp_path):
    dead = f"{dead_pid()}@{HOST}"
    fake_checkpoint(tmp_path / f".c0.old-{dead}-x1", "old")
    fake_checkpoint(tmp_path / f".c0.tmp-{dead}-x2", "new, never acknowledged")
    with pytest.raises(CheckpointError, match="missing fields"):  # recovered, then checked
        read_record(tmp_path / "c0")
    assert sorted(os.listdir(tmp_path)) == ["c0"]
    assert (tmp_path / "c0" / "weights").read_text() == "old"


def test_a_live_overwrite_between_its_renames_is_left_to_finish(tmp_path):
    live = f"{os.getpid()}@{HOST}"
    aside = fake_checkpoint(tmp_path / f".c0.old-{live}-x1", "old")
    with pytest.raises(FileNotFoundError):
        read_record(tmp_path / "c0")
    assert aside.exists() and not (tmp_path / "c0").exists()


def test_an_old_copy_beside_its_replacement_is_deleted(tmp_path):
    dead = f"{dead_pid()}@{HOST}"
    fake_checkpoint(tmp_path / "c0", "new")
    partly_deleted = tmp_path / f".c0.old-{dead}-x1"
    partly_deleted.mkdir()  # the kill fell during its deletion: no marker any more
    recover_checkpoints(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["c0"]
    assert (tmp_path / "c0" / "weights").read_text() == "new"


# ---- a real save, SIGKILLed in each window, recovered by a new process ---------------------


def run(child_env, *args: str, pause: bool = False) -> None:
    command = [sys.executable, str(SCRIPT), *args]
    if not pause:
        done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return
    child = subprocess.Popen(command, env=child_env(), stderr=subprocess.PIPE, text=True)
    lines = []
    for line in child.stderr:  # the hook says when it has stopped in the window
        lines.append(line)
        if line.startswith("TWINKLE_PAUSED"):
            break
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert lines and lines[-1].startswith(f"TWINKLE_PAUSED {args[2]} "), "".join(lines)[-3000:]


@pytest.mark.parametrize(
    "point, expected",
    [
        ("written", "c0"),  # the new folder complete, not yet renamed: c0 is the old one
        ("aside", "c0"),  # the old folder moved aside, the new one not in: rolled back
        ("placed", "ref"),  # the new folder in place, the old not yet deleted: it stays
    ],
)
def test_a_save_killed_in_a_window_resumes_exactly(tmp_path, child_env, point, expected):
    run(child_env, "save", str(tmp_path), point, pause=True)
    leftovers = [p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".")]
    assert leftovers  # the kill did leave the window's siblings behind
    run(child_env, "resume", str(tmp_path))
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["c0", "ref"]  # no .tmp-* or .old-*
    saved = json.loads((tmp_path / "save.json").read_text())
    resumed = json.loads((tmp_path / "resume.json").read_text())
    assert resumed["ref"]["step"] == 4
    if expected == "c0":  # the checkpoint saved before the kill, whole
        assert resumed["c0"] == {"step": 2, "losses": saved["after_c0"]}  # exact floats
    else:  # the new checkpoint, the same state as ref
        assert resumed["c0"] == resumed["ref"]
