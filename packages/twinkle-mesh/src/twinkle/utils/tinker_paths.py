"""Let the unmodified Tinker SDK take ``twinkle://`` checkpoint paths, once asked to.

A Twinkle server names a checkpoint ``twinkle://<run>/weights/<name>`` for the Twinkle client
and ``tinker://<run>/weights/<name>`` for the SDK: the same run, kind and name. The SDK checks
on the client that a path starts with ``tinker://`` (``create_sampling_client``,
``ParsedCheckpointTinkerPath``), so ``accept_twinkle_paths`` wraps every public SDK method
with a ``path``, ``model_path`` or ``tinker_path`` parameter to swap the scheme before the SDK
sees it. Nothing else changes, and nothing is wrapped until ``init_tinker_client()`` asks:
when the SDK is already imported it is wrapped at once, otherwise right after its import
(so ``init_tinker_client`` stays cheap and never imports the SDK for a user who has none).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

TWINKLE_SCHEME = "twinkle://"
TINKER_SCHEME = "tinker://"
PATH_PARAMETERS = frozenset({"path", "model_path", "tinker_path"})
CLIENT_CLASSES = ("ServiceClient", "TrainingClient", "SamplingClient", "RestClient")
# SDK 0.16.1 keeps RestClient out of the package namespace.
REST_CLIENT_MODULE = "tinker.lib.public_interfaces.rest_client"
WRAPPED = "__twinkle_paths__"


def as_tinker_path(value: Any) -> Any:
    """``twinkle://<run>/<kind>/<name>`` as the SDK writes it; anything else unchanged."""
    if isinstance(value, str) and value.startswith(TWINKLE_SCHEME):
        return TINKER_SCHEME + value[len(TWINKLE_SCHEME) :]
    return value


def accept_twinkle_paths() -> None:
    """Wrap the SDK now if it is imported, else as soon as it is (idempotent)."""
    module = sys.modules.get("tinker")
    if module is not None and hasattr(module, "ServiceClient"):
        wrap_sdk(module)
    elif not any(isinstance(finder, _WrapOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport())


def wrap_sdk(tinker: ModuleType) -> None:
    """Wrap the path-taking methods of the SDK's clients and of ParsedCheckpointTinkerPath."""
    classes = [getattr(tinker, name) for name in CLIENT_CLASSES if hasattr(tinker, name)]
    if not hasattr(tinker, "RestClient"):
        rest = importlib.import_module(REST_CLIENT_MODULE)
        classes.append(rest.RestClient)
    parsed = getattr(tinker.types, "ParsedCheckpointTinkerPath", None)
    for cls in [*classes, *([parsed] if parsed is not None else [])]:
        _wrap_class(cls)


def _wrap_class(cls: type) -> None:
    for name, raw in list(vars(cls).items()):
        if name.startswith("_"):
            continue
        kind = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
        fn = raw.__func__ if kind is not None else raw
        if not inspect.isfunction(fn) or getattr(fn, WRAPPED, False):
            continue
        wrapped = _rewriting(fn)
        if wrapped is not None:
            setattr(cls, name, kind(wrapped) if kind is not None else wrapped)


def _rewriting(fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``fn`` with its path arguments passed through ``as_tinker_path``; None if it has none."""
    signature = inspect.signature(fn)
    names = [name for name in signature.parameters if name in PATH_PARAMETERS]
    if not names:
        return None

    def rewrite(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError:  # let the SDK itself say what is wrong with the call
            return args, kwargs
        for name in names:
            if name in bound.arguments:
                bound.arguments[name] = as_tinker_path(bound.arguments[name])
        return bound.args, bound.kwargs

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = rewrite(args, kwargs)
            return await fn(*args, **kwargs)

    else:

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = rewrite(args, kwargs)
            return fn(*args, **kwargs)

    setattr(wrapper, WRAPPED, True)
    return wrapper


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds the ``tinker`` package as the other finders do, and wraps it once it has run."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "tinker":
            return None
        sys.meta_path.remove(self)  # one shot: later imports of tinker come from sys.modules
        spec = next(
            (
                found
                for finder in sys.meta_path
                if hasattr(finder, "find_spec")
                and (found := finder.find_spec(fullname, path, target)) is not None
            ),
            None,
        )
        if spec is not None and spec.loader is not None:
            spec.loader = _WrappingLoader(spec.loader)
        return spec


class _WrappingLoader(importlib.abc.Loader):
    """The SDK's own loader, then ``wrap_sdk`` on the loaded package."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        wrap_sdk(module)

    def __getattr__(self, name: str) -> Any:  # resource readers, get_data, is_package, ...
        return getattr(self._loader, name)
