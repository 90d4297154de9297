"""The tracking services, each behind the optional package it needs (imported on use).

Each backend writes under the run's ``output_dir`` where the service allows it, so a run's
records travel with its checkpoints; services that keep runs elsewhere (W&B and SwanLab
online) take their usual environment variables (``WANDB_MODE=offline``, ``WANDB_API_KEY``,
``SWANLAB_MODE``, ``MLFLOW_TRACKING_URI``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from twinkle.utils.tracking.base import Tracker, scalars


class TensorBoardTracker(Tracker):
    """Scalars in TensorBoard event files under ``output_dir/tensorboard/<run_name>``."""

    name = "tensorboard"

    def __init__(self, output_dir: Path, project: str, run_name: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.logdir = Path(output_dir) / "tensorboard" / run_name
        self.writer = SummaryWriter(log_dir=str(self.logdir))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, global_step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        lines = "\n".join(f"- {key}: {value}" for key, value in config.items())
        self.writer.add_text("config", lines)

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """A Weights & Biases run; ``WANDB_MODE=offline`` keeps it in ``output_dir/wandb``."""

    name = "wandb"

    def __init__(self, output_dir: Path, project: str, run_name: str) -> None:
        import wandb

        Path(output_dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=run_name, dir=str(output_dir), reinit=True)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log(scalars(metrics), step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker(Tracker):
    """An MLflow run; without ``MLFLOW_TRACKING_URI`` its files are in ``output_dir/mlruns``."""

    name = "mlflow"

    def __init__(self, output_dir: Path, project: str, run_name: str) -> None:
        import mlflow

        self.mlflow = mlflow
        if "MLFLOW_TRACKING_URI" not in os.environ:
            # MLflow's file store: no server or database, readable by `mlflow ui`; MLflow 3
            # keeps it in maintenance mode and asks for this opt-in to use it.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            mlflow.set_tracking_uri((Path(output_dir) / "mlruns").resolve().as_uri())
        mlflow.set_experiment(project)
        self.run = mlflow.start_run(run_name=run_name)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        # MLflow keys allow letters, digits and _-./ and spaces; our metric names use '/'.
        self.mlflow.log_metrics(scalars(metrics), step=step, run_id=self.run.info.run_id)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.mlflow.log_params({k: str(v) for k, v in config.items()}, run_id=self.run.info.run_id)

    def close(self) -> None:
        self.mlflow.end_run()


class SwanlabTracker(Tracker):
    """A SwanLab experiment; ``SWANLAB_MODE=local`` (or ``offline``) keeps it in
    ``output_dir/swanlog``."""

    name = "swanlab"

    def __init__(self, output_dir: Path, project: str, run_name: str) -> None:
        import swanlab

        self.swanlab = swanlab
        # experiment_name/logdir: the names SwanLab 0.6 takes and later releases still accept
        logdir = str(Path(output_dir) / "swanlog")
        self.run = swanlab.init(project=project, experiment_name=run_name, logdir=logdir)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.swanlab.log(scalars(metrics), step=step)

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.swanlab.config.update(dict(config))

    def close(self) -> None:
        self.swanlab.finish()
