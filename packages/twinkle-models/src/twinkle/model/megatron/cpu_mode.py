"""CPU (gloo) as a debug device for MegatronModel: a parallel layout checked without a GPU.

megatron-core 0.16 is written for GPUs and asks for CUDA in places that have nothing to do
with the maths: where it allocates a buffer (``device="cuda"``,
``torch.cuda.current_device()``, ``tensor.cuda()``), which generator its RNG tracker seeds
and forks, pinned host memory, a ``torch.cuda.FloatTensor`` type check in its optimizer and
gradient clipping, ``torch.cuda.synchronize``. ``cpu_mode()`` answers those calls with the
CPU while it is active, in the thread that entered it; everything else (the layers, the
pipeline schedules, the collectives on gloo) is megatron-core's own code, unchanged.

MegatronModel enters the mode around its construction and each of its method calls when its
device is the CPU (``runs_in_cpu_mode``). Outside those calls torch is untouched, so the
user's own code in the same process still fails on a missing GPU as it would, and a model on
a GPU never enters the mode.

What it is not: fast. Inside the mode every torch call passes through a Python hook, and
megatron-core's fused kernels are off; use it to debug a layout (tp, pp, vpp, cp, ep, dp) on
a laptop with a tiny model, not to train.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from types import FunctionType
from typing import Any, TypeVar

import torch
from torch.overrides import TorchFunctionMode

C = TypeVar("C", bound=type)

_thread = threading.local()
_install_lock = threading.Lock()
_installed = False


def in_cpu_mode() -> bool:
    """Whether this thread is inside ``cpu_mode()``."""
    return getattr(_thread, "depth", 0) > 0


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


class _CudaIsCpu(TorchFunctionMode):
    """Every torch call that asks for a CUDA device gets the CPU; CPU tensors answer
    ``.type()`` with the CUDA name, for megatron-core's fp32-parameter checks."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):  # pinned host memory only speeds up copies to a GPU
            kwargs["pin_memory"] = False
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if "cuda" in name else name.replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def _cpu_when_active(original: Callable, on_cpu: Callable) -> Callable:
    """``original``, answered by ``on_cpu`` inside the mode (of this thread) only."""

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        return on_cpu(*args, **kwargs) if in_cpu_mode() else original(*args, **kwargs)

    return call


def _cpu_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _set_cpu_rng_state(state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    torch.set_rng_state(state)


def _install() -> None:
    """Route the module-level CUDA functions megatron-core calls through ``in_cpu_mode``
    (once per process; outside the mode they behave as before)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from megatron.core.tensor_parallel import random as megatron_random

        cuda = torch.cuda
        cuda.current_device = _cpu_when_active(cuda.current_device, lambda: "cpu")
        cuda.synchronize = _cpu_when_active(cuda.synchronize, lambda device=None: None)
        # The RNG tracker seeds, reads and forks "the CUDA generator": the CPU one here.
        cuda.get_rng_state = _cpu_when_active(cuda.get_rng_state, _cpu_rng_state)
        cuda.manual_seed = _cpu_when_active(cuda.manual_seed, torch.manual_seed)
        megatron_random._get_cuda_rng_state = _cpu_when_active(
            megatron_random._get_cuda_rng_state, _cpu_rng_state
        )
        megatron_random._set_cuda_rng_state = _cpu_when_active(
            megatron_random._set_cuda_rng_state, _set_cpu_rng_state
        )
        _installed = True


@contextlib.contextmanager
def cpu_mode() -> Iterator[None]:
    """megatron-core's CUDA-bound calls answered by the CPU in this thread, until the block
    ends (re-entrant: nested blocks share the outer one)."""
    _install()
    depth = getattr(_thread, "depth", 0)
    _thread.depth = depth + 1
    try:
        if depth:
            yield
        else:
            with _CudaIsCpu():
                yield
    finally:
        _thread.depth = depth


def _in_device_mode(method: Callable) -> Callable:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        device = getattr(self, "device", None)
        if not isinstance(device, torch.device) or device.type != "cpu" or in_cpu_mode():
            return method(self, *args, **kwargs)
        with cpu_mode():
            return method(self, *args, **kwargs)

    call.__twinkle_cpu_mode__ = True
    return call


def _wrap_methods(cls: type) -> None:
    """Wrap every plain method ``cls`` resolves (static and class methods, properties and
    dunders stay as they are)."""
    for name in {n for klass in cls.__mro__[:-1] for n in vars(klass)}:
        if name.startswith("__") and name.endswith("__"):
            continue
        owner = next(klass for klass in cls.__mro__ if name in vars(klass))
        value = vars(owner)[name]
        if isinstance(value, FunctionType) and not getattr(value, "__twinkle_cpu_mode__", False):
            setattr(cls, name, _in_device_mode(value))


def runs_in_cpu_mode(cls: C) -> C:
    """Class decorator: every method of ``cls`` and its subclasses (own and inherited) runs
    inside ``cpu_mode()`` when the instance's ``device`` is the CPU."""
    _wrap_methods(cls)
    previous = cls.__dict__.get("__init_subclass__")

    def __init_subclass__(sub: type, **kwargs: Any) -> None:
        if previous is None:
            super(cls, sub).__init_subclass__(**kwargs)
        else:
            previous.__get__(None, sub)(**kwargs)
        _wrap_methods(sub)

    cls.__init_subclass__ = classmethod(__init_subclass__)
    return cls
