"""Which implementation of an op runs: the torch reference, or a registered fast path.

Every op has a torch reference that runs anywhere (CPU tests use it). A fast path names
the package it needs and the device types it runs on; it is chosen only when the tensors
are on such a device AND the package is installed. Whether it is installed is checked
with ``importlib.util.find_spec``, which does not import it: flash-linear-attention, once
imported, makes transformers pick its Triton kernels for every model, which breaks CPU
runs, so nothing here imports a fast-path package until a tensor on its device asks.

The environment switches (``twinkle.kernel.switches``: ``TWINKLE_KERNELS``, the
``TWINKLE_NPU_*`` variables) are applied here, in ``backends``: a fast path they turn off is
not usable. A fast path a switch explicitly requests that cannot run warns once (per op,
device type and switch) and the reference runs.

Devices are ``torch.device`` objects or device-type strings (``"npu"`` is not a valid
``torch.device`` until torch_npu is imported).
"""

from __future__ import annotations

import functools
import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from twinkle.kernel import switches

REFERENCE = "torch"
Device = torch.device | str


@dataclass(frozen=True)
class FastPath:
    """A faster implementation of an op: ``load()`` imports ``package`` and returns it."""

    backend: str
    package: str
    device_types: frozenset[str]
    load: Callable[[], Callable]


_references: dict[str, Callable] = {}
_fast_paths: dict[str, list[FastPath]] = {}


def register_reference(op: str, implementation: Callable) -> None:
    _references[op] = implementation
    _fast_paths.setdefault(op, [])


def register_fast_path(op: str, path: FastPath) -> None:
    """Add ``path`` for ``op``; earlier registrations win when several apply."""
    others = [p for p in _fast_paths[_known(op)] if p.backend != path.backend]
    _fast_paths[op] = [*others, path]


def is_installed(package: str) -> bool:
    """Whether ``package`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def device_type(device: Device) -> str:
    return device if isinstance(device, str) else device.type


def _runnable(op: str, kind: str) -> list[FastPath]:
    """The fast paths of ``op`` whose device type and package are present (switches aside)."""
    paths = _fast_paths[_known(op)]
    return [p for p in paths if kind in p.device_types and is_installed(p.package)]


def backends(op: str, device: Device) -> list[str]:
    """The backends that would run ``op`` on ``device``, fastest first; the reference last.
    Empty of fast paths when the switches turn them off (``switches.read().allows``)."""
    kind = device_type(device)
    _known(op)
    if not switches.read().allows(op, kind):
        return [REFERENCE]
    return [*(p.backend for p in _runnable(op, kind)), REFERENCE]


def fast_path(op: str, device: Device) -> Callable | None:
    """The fast path ``select`` would run for ``op`` on ``device``; None where it is the
    reference (for callers that keep a CPU path of their own, such as chunked logps)."""
    implementation = select(op, device)
    return None if implementation is _references[op] else implementation


def select(op: str, device: Device, backend: str | None = None) -> Callable:
    """The implementation of ``op`` for tensors on ``device``.

    ``backend=None`` picks the first usable fast path, else the reference;
    ``backend='torch'`` forces the reference; a fast path's name forces it, and is an
    error where it cannot run. ``TWINKLE_KERNELS=off`` (or an NPU switch at 0, on NPU)
    makes every choice the reference, a forced one included.
    """
    kind = device_type(device)
    _known(op)
    settings = switches.read()
    if not settings.allows(op, kind):
        return _references[op]
    usable = backends(op, kind)
    name = usable[0] if backend is None else backend
    if name == REFERENCE:
        if backend is None:
            requested = settings.requesting(op)
            if requested is not None:
                _warn_unavailable(op, kind, requested)
        return _references[op]
    if name not in usable:
        known = {p.backend: p for p in _fast_paths[op]}
        if name not in known:
            raise ValueError(
                f"unknown backend {name!r} for {op}; known: {', '.join([*known, REFERENCE])}"
            )
        path = known[name]
        raise ValueError(
            f"backend {name!r} cannot run {op} on {kind}: it needs the "
            f"{path.package!r} package and a device of type {', '.join(sorted(path.device_types))}"
            f"; use backend='torch' (the reference) or None (choose automatically)"
        )
    return _load(op, name)


@functools.cache
def _warn_unavailable(op: str, kind: str, requested: str) -> None:
    """Once per (op, device type, switch): the requested fast path cannot run here."""
    needs = "; ".join(
        f"{p.backend} needs {p.package!r} on {'/'.join(sorted(p.device_types))}"
        for p in _fast_paths[op]
    )
    warnings.warn(
        f"{requested} asks for a fast path of {op}, but none can run on {kind} "
        f"({needs or 'no fast path is registered'}); running the torch reference",
        RuntimeWarning,
        stacklevel=3,
    )


@functools.cache
def _load(op: str, backend: str) -> Callable:
    return next(p for p in _fast_paths[op] if p.backend == backend).load()


def _known(op: str) -> str:
    if op not in _references:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(sorted(_references))}")
    return op
