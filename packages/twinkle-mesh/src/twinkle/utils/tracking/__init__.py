"""Experiment tracking: where a training loop's metrics go, chosen by name.

    tracker = create_tracker(["tensorboard", "wandb"], output_dir="output/run", run_name="sft")
    for step, batch in enumerate(dataloader):
        ...
        tracker.log(model.calculate_metric(is_training=True), step=step)
    tracker.close()

Every tracker also keeps ``metrics.jsonl`` in ``output_dir`` (one JSON object per ``log``
call), which ``plot_metric`` turns into a curve. A backend whose service fails (W&B online
without a network) warns once and is dropped: the training goes on.
"""

from twinkle.utils.tracking.base import Tracker
from twinkle.utils.tracking.curve import plot_metric, read_metrics
from twinkle.utils.tracking.factory import BACKENDS, create_tracker

__all__ = ["BACKENDS", "Tracker", "create_tracker", "plot_metric", "read_metrics"]
