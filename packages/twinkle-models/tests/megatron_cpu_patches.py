"""TEST-ONLY: let megatron-core 0.16 run on CPU with gloo, for the equivalence tests.

megatron-core calls CUDA directly in places that have nothing to do with the
maths: where a buffer is allocated (``device="cuda"``, ``torch.cuda.current_device()``),
which generator its RNG tracker forks, pinned host memory (context parallel's rotary
positions), a ``torch.cuda.FloatTensor`` type check in
the optimizer and gradient clipping, ``torch.cuda.synchronize``. ``apply()``
redirects those to the CPU for the whole process. The library
(``twinkle.model.megatron``) never imports this module: on a GPU it runs against
the unpatched megatron-core. Call ``apply()`` once, before building a model.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_MODE: TorchFunctionMode | None = None


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.startswith("cuda")


class _CudaIsCpu(TorchFunctionMode):
    """Every torch call asking for a CUDA device gets the CPU; CPU float tensors answer
    ``.type()`` as CUDA ones, for megatron's type checks."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):  # pinned host memory is for copies to a GPU
            kwargs["pin_memory"] = False
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if "cuda" not in name else name
        if func is torch.Tensor.to and args and _is_cuda(args[1] if len(args) > 1 else None):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def _cpu_rng_state(device=None, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    return torch.get_rng_state()


def _set_cpu_rng_state(state: torch.Tensor, device: int = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(state)


def _causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq), diagonal=1).bool()


def apply() -> None:
    """Patch torch.cuda and megatron-core for a CPU run (idempotent)."""
    global _MODE
    if _MODE is not None:
        return
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda device=None: None
    # The RNG tracker seeds, reads and forks "the CUDA generator": use the CPU one.
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)

    from megatron.core.tensor_parallel import random as megatron_random

    megatron_random._get_cuda_rng_state = _cpu_rng_state
    megatron_random._set_cuda_rng_state = _set_cpu_rng_state

    from megatron.core.transformer import utils as transformer_utils

    transformer_utils.get_default_causal_mask = _causal_mask
    _MODE = _CudaIsCpu()
    _MODE.__enter__()
