"""Experiment tracking: every backend records what the loop logged, read back from its own
files; unknown names and missing packages fail before training; a failing service warns once
and training goes on."""

from __future__ import annotations

import json
import math
import sys

import pytest

from twinkle.utils.tracking import BACKENDS, create_tracker, factory, plot_metric, read_metrics

LOSSES = [2.5, 1.25, 0.5]


def _train(tracker, losses=LOSSES) -> None:
    """What a loop does: one calculate_metric() result per step, then close."""
    tracker.log_config({"lr": 1e-4, "lora_rank": 8})
    for step, loss in enumerate(losses):
        tracker.log({"loss": loss, "lr": 1e-4, "note": "text", "done": True}, step=step)
    tracker.close()


@pytest.fixture
def quiet_services(monkeypatch, tmp_path):
    """Every service offline and its home in tmp: nothing leaves the machine."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield
    if "wandb" in sys.modules:  # W&B keeps its settings in a process-wide singleton
        sys.modules["wandb"].teardown()


def test_every_run_keeps_metrics_jsonl_with_the_numbers_only(tmp_path):
    _train(create_tracker("none", output_dir=tmp_path))
    records = read_metrics(tmp_path)
    assert [r["loss"] for r in records] == LOSSES and [r["step"] for r in records] == [0, 1, 2]
    assert all(set(r) == {"step", "loss", "lr"} for r in records)  # no strings, no bools


def test_non_finite_values_are_not_plotted(tmp_path):
    tracker = create_tracker(None, output_dir=tmp_path)
    tracker.log({"loss": math.nan, "grad_norm": math.inf, "lr": 0.1}, step=0)
    tracker.close()
    assert read_metrics(tmp_path) == [{"step": 0, "lr": 0.1}]


def test_tensorboard_event_files_hold_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _train(create_tracker("tensorboard", output_dir=tmp_path, run_name="sft"))
    events = EventAccumulator(str(tmp_path / "tensorboard" / "sft"))
    events.Reload()
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == [0, 1, 2]
    assert [e.value for e in loss] == pytest.approx(LOSSES)


def test_wandb_offline_run_is_written_with_the_last_values(tmp_path, quiet_services):
    tracker = create_tracker(["wandb"], output_dir=tmp_path, project="p", run_name="sft")
    wandb_run = None
    tracker.log_config({"lr": 1e-4})
    for step, loss in enumerate(LOSSES):
        tracker.log({"loss": loss}, step=step)
        wandb_run = tracker.trackers[1].inner._tracker.run
    # W&B commits a step when a later one starts (so a step may be logged in parts): the
    # summary holds the step before the last until the run ends
    assert wandb_run.summary["loss"] == pytest.approx(LOSSES[-2])
    assert wandb_run.config["lr"] == pytest.approx(1e-4)
    tracker.close()
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    assert any(p.suffix == ".wandb" and p.stat().st_size > 0 for p in run_dir.iterdir())


def test_mlflow_file_store_holds_the_metric_history(tmp_path, quiet_services):
    from mlflow.tracking import MlflowClient

    tracker = create_tracker("mlflow", output_dir=tmp_path, project="p", run_name="sft")
    _train(tracker)
    run_id = tracker.trackers[1].inner._tracker.run.info.run_id
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    history = client.get_metric_history(run_id, "loss")
    assert [m.step for m in history] == [0, 1, 2]
    assert [m.value for m in history] == pytest.approx(LOSSES)
    assert client.get_run(run_id).data.params["lora_rank"] == "8"


def test_swanlab_offline_run_is_backed_up_under_the_output_dir(tmp_path, quiet_services):
    _train(create_tracker("swanlab", output_dir=tmp_path, project="p", run_name="sft"))
    (run_dir,) = (tmp_path / "swanlog").glob("run-*")
    assert b"loss" in (run_dir / "backup.swanlab").read_bytes()


def test_loss_curve_png_from_the_record(tmp_path):
    _train(create_tracker("none", output_dir=tmp_path))
    path = plot_metric(tmp_path)
    assert path == tmp_path / "loss_curve.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000
    with pytest.raises(ValueError, match="no 'reward'"):
        plot_metric(tmp_path, "reward")


def test_an_unknown_backend_lists_the_known_ones_and_their_extras(tmp_path):
    with pytest.raises(ValueError) as error:
        create_tracker("tensorbord", output_dir=tmp_path)
    message = str(error.value)
    assert "unknown tracker 'tensorbord'" in message
    for name, (_, _, extra) in BACKENDS.items():
        assert name in message and f"twinkle-mesh[{extra}]" in message
    with pytest.raises(ValueError, match="'none' cannot be combined"):
        create_tracker(["none", "wandb"], output_dir=tmp_path)


def test_a_backend_whose_package_is_missing_names_the_extra(tmp_path, monkeypatch):
    tracker_cls, _, extra = BACKENDS["wandb"]
    monkeypatch.setitem(BACKENDS, "wandb", (tracker_cls, "no_such_package_here", extra))
    with pytest.raises(ImportError, match=r"pip install 'twinkle-mesh\[wandb\]'"):
        create_tracker("wandb", output_dir=tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()  # failed before anything was written


def test_wandb_online_without_credentials_warns_once_and_training_goes_on(
    tmp_path, quiet_services, monkeypatch, capsys
):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    _train(create_tracker("wandb", output_dir=tmp_path))
    warnings = [x for x in capsys.readouterr().err.splitlines() if "tracker 'wandb' failed" in x]
    assert len(warnings) == 1 and "training goes on" in warnings[0]
    assert [r["loss"] for r in read_metrics(tmp_path)] == LOSSES  # the record is complete


def test_a_backend_that_fails_mid_run_is_dropped_after_one_warning(tmp_path, monkeypatch, capsys):
    class Flaky(factory.Tracker):
        name = "tensorboard"
        calls = 0

        def __init__(self, *args):
            pass

        def log(self, metrics, step):
            Flaky.calls += 1
            if step == 1:
                raise ConnectionError("service went away")

    monkeypatch.setitem(BACKENDS, "tensorboard", (Flaky, "json", "tensorboard"))
    _train(create_tracker("tensorboard", output_dir=tmp_path))
    assert Flaky.calls == 2  # step 0, then the failing step 1; never called again
    assert capsys.readouterr().err.count("failed in log") == 1
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 2
