"""The ``twinkle`` command: its help, its version and the flags that reach the main job."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from twinkle import cli
from twinkle.cli import main

CHECKOUT_JOB = Path(__file__).resolve().parents[3] / "cookbook" / "quickstart.py"


def _exit_output(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(list(argv))
    out, err = capsys.readouterr()
    return done.value.code, out, err


def test_help_names_the_command_and_documents_every_flag_with_its_default(capsys):
    code, out, _ = _exit_output(capsys, "--help")
    assert code == 0 and out.startswith("usage: twinkle ")
    flags = re.findall(r"^  (--[a-z-]+)", out, re.MULTILINE)
    assert {"--lr", "--lora-rank", "--batch-size", "--epochs", "--version"} <= set(flags)
    assert "(default: 30)" in out and "(default: 8)" in out  # epochs, batch size
    assert "(default: None)" not in out  # flags without a fixed default say what they do


def test_version_is_the_distributions(capsys):
    code, out, _ = _exit_output(capsys, "--version")
    assert code == 0 and out.strip() == f"twinkle {version('twinkle-rl')}"


@pytest.mark.parametrize(("flag", "value"), [("--lr", "-1"), ("--lr", "inf"), ("--epochs", "0")])
def test_bad_values_name_the_flag(capsys, flag, value):
    code, _, err = _exit_output(capsys, flag, value)
    assert code == 2 and f"argument {flag}" in err and repr(value) in err


def test_lora_rank_batch_size_and_lr_reach_the_job(tmp_path, capsys):
    main(
        ["--lora-rank", "2", "--lr", "3e-3", "--batch-size", "4", "--epochs", "1"]
        + ["--max-steps", "2", "--output-dir", str(tmp_path)]
    )
    checkpoint = tmp_path / "last-checkpoint"
    adapter = json.loads(next(checkpoint.rglob("adapter_config.json")).read_text())
    assert adapter["r"] == 2
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["consumed_train_samples"] == 2 * 4  # two steps of four rows
    optimizer = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    assert optimizer["param_groups"][0]["initial_lr"] == pytest.approx(3e-3)
    # the answer comes from the sampler that loaded the saved adapter
    assert re.search(r"^A: ", capsys.readouterr().out, re.MULTILINE)


def test_the_twinkle_command_runs_the_cookbook_main_job(tmp_path):
    assert cli.job_path() == CHECKOUT_JOB
    done = subprocess.run(
        [sys.executable, "-m", "twinkle.cli", "--max-steps", "3", "--output-dir", "out"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "epoch 1: loss" in done.stdout
    assert (tmp_path / "out" / "last-checkpoint" / "model.safetensors").is_file()
    assert re.search(r"^A: ", done.stdout, re.MULTILINE), done.stdout
