"""Optimizers and learning-rate schedulers by registry name (see ``optimizer`` and
``scheduler`` for the weight-decay rule and the schedule formulas)."""

from twinkle.module.optimizer import OPTIMIZERS, build_optimizer
from twinkle.module.scheduler import (
    LR_SCHEDULERS,
    ConstantWarmupScheduler,
    CosineWarmupScheduler,
    LinearWarmupScheduler,
    build_lr_scheduler,
)

__all__ = [
    "LR_SCHEDULERS",
    "OPTIMIZERS",
    "ConstantWarmupScheduler",
    "CosineWarmupScheduler",
    "LinearWarmupScheduler",
    "build_lr_scheduler",
    "build_optimizer",
]
