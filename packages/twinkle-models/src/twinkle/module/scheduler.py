"""Learning-rate schedules with linear warmup, by name.

Step ``s`` is the number of ``scheduler.step()`` calls so far (TransformersModel makes one per
``clip_grad_and_step`` call, i.e. per batch, whatever the gradient accumulation), and
the learning rate of each parameter group is ``peak * factor(s)`` with ``peak`` its initial lr
(or ``max_lr``). With ``W`` warmup steps, ``N`` training steps and ``m = min_lr_ratio``:

* warmup, ``s < W``: ``factor = (s + 1) / (W + 1)``. It never is 0, so the first update
  already learns, and it meets the peak exactly at ``s = W``;
* decay, ``W <= s < N``: ``factor = m + (1 - m) * shape(p)`` with ``p = (s - W) / (N - W)``,
  ``shape(p) = (1 + cos(pi p)) / 2`` (cosine) or ``1 - p`` (linear);
* after, ``s >= N``: ``factor = m``.

``W > N`` is allowed with a warning (one of the user's examples warms up for 500 steps of a
10-step run): the whole run is then warmup. The Megatron-style names ``lr_warmup_steps``,
``lr_decay_steps`` are aliases of ``num_warmup_steps``, ``num_training_steps``, and
``max_lr`` sets the peak of every parameter group (overriding the optimizer's ``lr``), so
``build_lr_scheduler(opt, 'default', lr_decay_steps=200, max_lr=1e-5)`` works; ``'default'``
is ``CosineWarmupScheduler``.

The schedules are closed-form in ``s``, so ``state_dict``/``load_state_dict`` resume them
exactly; loading also puts the resumed lr back into the optimizer's groups.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from twinkle.module._args import check_kwargs
from twinkle.utils import Registry, get_logger

logger = get_logger(__name__)

LR_SCHEDULERS: Registry[type[LRScheduler]] = Registry("lr scheduler", base=LRScheduler)
for _name in dir(torch.optim.lr_scheduler):
    _cls = getattr(torch.optim.lr_scheduler, _name)
    if (
        isinstance(_cls, type)
        and issubclass(_cls, LRScheduler)
        and not _name.startswith("_")
        and _cls is not LRScheduler
    ):
        LR_SCHEDULERS.register(_cls)


def _steps(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int (a number of scheduler steps), got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _alias(name: str, value: object, alias: str, alias_value: object) -> object:
    if value is not None and alias_value is not None:
        raise ValueError(f"{alias} is an alias of {name}; give one of them, not both")
    return alias_value if value is None else value


class _WarmupScheduler(LRScheduler, ABC):
    """Linear warmup to the peak over ``num_warmup_steps``, then ``after_warmup(s)``."""

    def __init__(
        self,
        optimizer: Optimizer,
        num_warmup_steps: int | None = None,
        *,
        max_lr: float | None = None,
        lr_warmup_steps: int | None = None,
        last_epoch: int = -1,
    ) -> None:
        warmup = _alias("num_warmup_steps", num_warmup_steps, "lr_warmup_steps", lr_warmup_steps)
        self.num_warmup_steps = _steps("num_warmup_steps", 0 if warmup is None else warmup, 0)
        if max_lr is not None:
            if isinstance(max_lr, bool) or not isinstance(max_lr, numbers.Real) or max_lr <= 0:
                raise ValueError(f"max_lr must be a positive number, got {max_lr!r}")
            for group in optimizer.param_groups:
                group["lr"] = group["initial_lr"] = float(max_lr)
        super().__init__(optimizer, last_epoch)

    def lr_factor(self, step: int) -> float:
        """The multiplier of the peak learning rate at ``step``."""
        if step < self.num_warmup_steps:
            return (step + 1) / (self.num_warmup_steps + 1)
        return self.after_warmup(step)

    @abstractmethod
    def after_warmup(self, step: int) -> float:
        """The multiplier of the peak at ``step >= num_warmup_steps``."""

    def get_lr(self) -> list[float | torch.Tensor]:
        factor = self.lr_factor(self.last_epoch)
        return [base_lr * factor for base_lr in self.base_lrs]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        # The optimizer may be fresh; give it the lr the resumed step uses.
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


@LR_SCHEDULERS.register
class ConstantWarmupScheduler(_WarmupScheduler):
    """Linear warmup, then the peak learning rate for ever."""

    def after_warmup(self, step: int) -> float:
        return 1.0


class _DecayScheduler(_WarmupScheduler):
    """Warmup, then decay from the peak to ``min_lr_ratio * peak`` at ``num_training_steps``."""

    def __init__(
        self,
        optimizer: Optimizer,
        num_warmup_steps: int | None = None,
        num_training_steps: int | None = None,
        min_lr_ratio: float = 0.0,
        *,
        max_lr: float | None = None,
        lr_warmup_steps: int | None = None,
        lr_decay_steps: int | None = None,
        last_epoch: int = -1,
    ) -> None:
        total = _alias("num_training_steps", num_training_steps, "lr_decay_steps", lr_decay_steps)
        if total is None:
            raise ValueError(
                f"{type(self).__name__} needs num_training_steps: the number of scheduler steps "
                "of the run, which with TransformersModel is its number of clip_grad_and_step "
                "calls (batches, e.g. len(dataloader) per epoch)"
            )
        self.num_training_steps = _steps("num_training_steps", total, 1)
        if isinstance(min_lr_ratio, bool) or not isinstance(min_lr_ratio, numbers.Real):
            raise TypeError(f"min_lr_ratio must be a number in [0, 1], got {min_lr_ratio!r}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        self.min_lr_ratio = float(min_lr_ratio)
        super().__init__(
            optimizer,
            num_warmup_steps,
            max_lr=max_lr,
            lr_warmup_steps=lr_warmup_steps,
            last_epoch=last_epoch,
        )
        if self.num_warmup_steps > self.num_training_steps:
            logger.warning(
                "num_warmup_steps=%d exceeds num_training_steps=%d: the learning rate warms up "
                "for the whole run and never decays",
                self.num_warmup_steps,
                self.num_training_steps,
            )

    def after_warmup(self, step: int) -> float:
        if step >= self.num_training_steps:
            return self.min_lr_ratio
        progress = (step - self.num_warmup_steps) / (
            self.num_training_steps - self.num_warmup_steps
        )
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * self.shape(progress)

    @abstractmethod
    def shape(self, progress: float) -> float:
        """The decay curve on ``progress`` in [0, 1): 1 at the start, toward 0 at the end."""


@LR_SCHEDULERS.register
class CosineWarmupScheduler(_DecayScheduler):
    """Warmup, then half a cosine from the peak down to ``min_lr_ratio * peak``."""

    def shape(self, progress: float) -> float:
        return 0.5 * (1.0 + math.cos(math.pi * progress))


@LR_SCHEDULERS.register
class LinearWarmupScheduler(_DecayScheduler):
    """Warmup, then a straight line from the peak down to ``min_lr_ratio * peak``."""

    def shape(self, progress: float) -> float:
        return 1.0 - progress


LR_SCHEDULERS.register(CosineWarmupScheduler, name="default")


def build_lr_scheduler(
    optimizer: Optimizer, scheduler_cls: str | type[LRScheduler], **kwargs: object
) -> LRScheduler:
    """``scheduler_cls`` (a registered name, any ``torch.optim.lr_scheduler`` name, or a
    class) built on ``optimizer`` with ``kwargs``; a keyword the class does not take is an
    error that lists the ones it does."""
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"build_lr_scheduler needs a torch Optimizer, got {optimizer!r}")
    cls = LR_SCHEDULERS.get(scheduler_cls)
    check_kwargs(cls, kwargs, "lr scheduler")
    return cls(optimizer, **kwargs)
