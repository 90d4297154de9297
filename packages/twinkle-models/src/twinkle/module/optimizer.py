"""Optimizers by name, with weight decay kept off the parameters it should not shrink.

``build_optimizer(model, 'AdamW', lr=1e-4)`` resolves the name in ``OPTIMIZERS`` (every
``torch.optim`` optimizer under its class name, ``'default'`` = AdamW, and anything a user
registers) and builds at most two parameter groups from the *trainable* parameters only
(``requires_grad``; frozen ones never reach the optimizer):

* no decay: every parameter with fewer than two dimensions (biases, norm scales, scalar
  gates), every parameter named ``bias``, and every parameter owned by a module whose class
  name contains ``Norm`` (``LayerNorm``, ``RMSNorm``, ``Qwen3RMSNorm``, ``BatchNorm1d``, ...).
  Decay on these pulls scales and offsets toward zero, which harms rather than regularises.
* decay: everything else, embeddings and LoRA matrices included.

Given a plain iterable of tensors instead of a module, only the dimension rule applies (there
are no names or modules to look at).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable

import torch
from torch import nn
from torch.optim import Optimizer

from twinkle.module._args import check_kwargs
from twinkle.utils import Registry

OPTIMIZERS: Registry[type[Optimizer]] = Registry("optimizer", base=Optimizer)
for _name in dir(torch.optim):
    _cls = getattr(torch.optim, _name)
    if isinstance(_cls, type) and issubclass(_cls, Optimizer) and _cls is not Optimizer:
        OPTIMIZERS.register(_cls)
# The Megatron-style examples call ``set_optimizer('default', lr=...)``.
OPTIMIZERS.register(torch.optim.AdamW, name="default")


def _is_norm(module: nn.Module) -> bool:
    return "Norm" in type(module).__name__


def _split_module(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            # A tied parameter appears under several modules; the first one decides.
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            skip = param.ndim < 2 or name == "bias" or _is_norm(module)
            (no_decay if skip else decay).append(param)
    return decay, no_decay


def _split_tensors(params: Iterable[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    decay: list[torch.Tensor] = []
    no_decay: list[torch.Tensor] = []
    seen: set[int] = set()
    for index, param in enumerate(params):
        if not isinstance(param, torch.Tensor):
            raise TypeError(
                f"build_optimizer takes an nn.Module or an iterable of tensors; item {index} "
                f"is {type(param).__name__}"
            )
        if id(param) in seen or not param.requires_grad:
            continue
        seen.add(id(param))
        (no_decay if param.ndim < 2 else decay).append(param)
    return decay, no_decay


def _takes_weight_decay(cls: type[Optimizer]) -> bool:
    params = inspect.signature(cls).parameters.values()
    return any(p.name == "weight_decay" or p.kind is p.VAR_KEYWORD for p in params)


def _check_finite(cls: type[Optimizer], kwargs: dict[str, object]) -> None:
    """Every number of the optimizer's arguments is finite. torch checks ranges with
    comparisons (``0.0 <= lr``), which take ``lr=inf`` or ``weight_decay=inf``, and the
    first step then turns every trained weight into NaN."""
    parameters = inspect.signature(cls).parameters
    for name, value in kwargs.items():
        default = parameters[name].default if name in parameters else None
        numeric = isinstance(default, int | float) and not isinstance(default, bool)
        number = isinstance(value, int | float | torch.Tensor) and not isinstance(value, bool)
        if numeric and value is not None and not number:  # None: the default (weight_decay)
            raise ValueError(f"optimizer {cls.__name__}: {name} must be a number, got {value!r}")
        for item in value if isinstance(value, tuple | list) else (value,):
            finite = True
            if isinstance(item, float):
                finite = math.isfinite(item)
            elif isinstance(item, torch.Tensor) and item.is_floating_point():
                finite = bool(torch.isfinite(item).all())
            if not finite:
                raise ValueError(
                    f"optimizer {cls.__name__}: {name} must be a finite number, got {value!r}"
                )


def build_optimizer(
    params_or_model: nn.Module | Iterable[torch.Tensor],
    optimizer_cls: str | type[Optimizer] = "AdamW",
    weight_decay: float | None = None,
    **kwargs: object,
) -> Optimizer:
    """An optimizer over the trainable parameters, with the no-decay group described above.

    ``weight_decay=None`` keeps the optimizer's own default for the decay group (0.01 for
    AdamW, 0 for SGD); the no-decay group always gets 0. ``kwargs`` go to the optimizer
    (``lr``, ``betas``, ...). An optimizer without a ``weight_decay`` argument gets one group.
    """
    cls = OPTIMIZERS.get(optimizer_cls)
    check_kwargs(cls, kwargs, "optimizer")
    _check_finite(cls, {**kwargs, "weight_decay": weight_decay})
    if weight_decay is not None and (
        isinstance(weight_decay, bool) or not isinstance(weight_decay, int | float)
    ):
        raise TypeError(f"weight_decay must be a number, got {weight_decay!r}")
    if weight_decay is not None and weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    if isinstance(params_or_model, nn.Module):
        decay, no_decay = _split_module(params_or_model)
    else:
        decay, no_decay = _split_tensors(params_or_model)
    if not decay and not no_decay:
        raise ValueError(
            "no trainable parameters: every parameter has requires_grad=False; add an adapter "
            "or unfreeze the parameters to train before building the optimizer"
        )
    if not _takes_weight_decay(cls):
        if weight_decay is not None:
            raise ValueError(f"{cls.__name__} has no weight_decay argument; drop weight_decay")
        return cls(decay + no_decay, **kwargs)
    decay_group: dict[str, object] = {"params": decay}
    if weight_decay is not None:
        decay_group["weight_decay"] = weight_decay
    groups = [decay_group, {"params": no_decay, "weight_decay": 0.0}]
    return cls([group for group in groups if group["params"]], **kwargs)
