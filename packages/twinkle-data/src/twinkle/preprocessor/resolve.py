"""Turn what a user passes to ``Dataset.map``/``Dataset.filter`` (a registered name, a
class, an instance, or a plain function) into one Preprocessor or Filter instance."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from twinkle.preprocessor.base import FILTERS, PREPROCESSORS, Filter, Preprocessor
from twinkle.utils import Registry


class FunctionPreprocessor(Preprocessor):
    """Wraps a plain function ``row -> Trajectory | dict`` so ``map(fn)`` works like any
    preprocessor. The function is hashed by its code, so keep it free of mutable state."""

    def __init__(self, function: Callable[[Mapping[str, Any]], Any]) -> None:
        self.function = function

    def __call__(self, row: Mapping[str, Any]) -> Any:
        return self.function(row)

    def __repr__(self) -> str:
        return getattr(self.function, "__qualname__", repr(self.function))


class FunctionFilter(Filter):
    """Wraps a plain function ``row -> bool`` so ``filter(fn)`` works like any Filter."""

    def __init__(self, function: Callable[[Any], bool]) -> None:
        self.function = function

    def __call__(self, row: Any) -> bool:
        return self.function(row)

    def __repr__(self) -> str:
        return getattr(self.function, "__qualname__", repr(self.function))


def build_preprocessor(
    spec: str | type[Preprocessor] | Preprocessor | Callable[..., Any],
    init_args: Mapping[str, Any] | None = None,
) -> Preprocessor:
    """A Preprocessor from a registered name or class (built with ``init_args``), an
    instance (used as is), or a function ``row -> Trajectory`` (wrapped)."""
    return _build(spec, init_args, PREPROCESSORS, Preprocessor, FunctionPreprocessor)


def build_filter(
    spec: str | type[Filter] | Filter | Callable[[Any], bool],
    init_args: Mapping[str, Any] | None = None,
) -> Filter:
    """A Filter from a registered name or class (built with ``init_args``), an instance, or
    a function ``row -> bool``."""
    return _build(spec, init_args, FILTERS, Filter, FunctionFilter)


def _build(
    spec: Any, init_args: Mapping[str, Any] | None, registry: Registry, base: type, wrapper: type
) -> Any:
    if isinstance(spec, str | type):
        cls = registry.get(spec)
        return cls(**dict(init_args or {}))
    if init_args:
        raise TypeError(
            f"init_args is for a {registry.kind} given by name or class; {spec!r} is already "
            "built, so pass its arguments to its constructor instead"
        )
    if isinstance(spec, base):
        return spec
    if callable(spec):
        return wrapper(spec)
    raise TypeError(
        f"expected a {registry.kind} name, class, instance or function, got {spec!r}; "
        f"known names: {', '.join(registry.names())}"
    )
