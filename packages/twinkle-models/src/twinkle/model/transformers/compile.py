"""``TransformersModel(compile=True)``: the decoder layers compiled with ``torch.compile``,
in place, and eager again, with one warning naming the cause, wherever compilation fails.

Each decoder layer (the classes the model lists in ``_no_split_modules``) is compiled on its
own rather than the whole model: the module tree, its parameter names and its peft wrapping
stay as they are, layers of one class share one compiled graph, and the loss, the head and
the twinkle code around the forward stay eager. Compilation happens at a layer's first
call, so adapters added after the constructor are compiled with it. Batches of new lengths
(padded widths, packed rows) recompile until torch marks the length dynamic.

Where it is correct: one process and DDP, which run the layers as they are. FSDP2, expert
and sequence parallel put hooks and collectives inside the layers; there the layers run
eager, with a warning. A failure at compile time (an unsupported operation, a backend
error such as no C++ compiler for the CPU backend: torch's ``TorchDynamoException``) turns
compilation off for every layer of the model and runs the failing call eagerly, so an
error that eager raises too is raised as it is.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch._dynamo.exc import TorchDynamoException

COMPILED_STRATEGIES = ("single", "ddp")
"""ParallelPlan kinds under which compiled layers are known to be correct."""


def compile_options(compile: bool | Mapping[str, Any]) -> dict[str, Any] | None:
    """``compile`` as torch.compile keyword arguments (None: off); refuses anything else."""
    if compile is False:
        return None
    if compile is True:
        return {}
    if isinstance(compile, Mapping):
        return dict(compile)
    raise TypeError(
        f"compile must be True, False or a dict of torch.compile keyword arguments "
        f"(e.g. {{'mode': 'max-autotune'}}), got {compile!r}"
    )


class CompiledLayers:
    """The compiled decoder layers of one model and the switch back to eager."""

    def __init__(
        self, model: nn.Module, options: Mapping[str, Any], strategy: Callable[[], str]
    ) -> None:
        self.strategy = strategy
        self.failure: str | None = None
        names = set(getattr(model, "_no_split_modules", None) or ())
        self.layers = [m for m in model.modules() if type(m).__name__ in names]
        if not self.layers:
            self._fall_back(
                f"{type(model).__name__} names no decoder layer class (_no_split_modules)"
            )
        for layer in self.layers:
            layer._compiled_call_impl = self._guarded(
                layer, torch.compile(layer._call_impl, **options)
            )

    @property
    def active(self) -> bool:
        return self.failure is None

    def _guarded(self, layer: nn.Module, compiled: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.active and self.strategy() not in COMPILED_STRATEGIES:
                self._fall_back(
                    f"the {self.strategy()} strategy runs hooks or collectives inside the "
                    f"layers; compile=True is supported on one process and under DDP"
                )
            if not self.active:
                return layer._call_impl(*args, **kwargs)
            try:
                return compiled(*args, **kwargs)
            except TorchDynamoException as error:  # tracing or the backend failed
                self._fall_back(f"{type(error).__name__}: {_first_lines(error)}")
                return layer._call_impl(*args, **kwargs)

        return call

    def _fall_back(self, cause: str) -> None:
        """Every layer eager from now on, with one warning."""
        if self.failure is not None:
            return
        self.failure = cause
        for layer in self.layers:
            layer._compiled_call_impl = None
        warnings.warn(
            f"compile=True: running the model eagerly, because {cause}",
            RuntimeWarning,
            stacklevel=3,
        )


def _first_lines(error: Exception, count: int = 2) -> str:
    """The start of a torch compile error: what failed and why, without the advice after."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return " ".join(lines[:count])[:400]
