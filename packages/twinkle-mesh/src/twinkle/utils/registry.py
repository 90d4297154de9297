"""Registry: look a component class up by name, so ``set_loss('GRPOLoss')`` and
``set_loss(GRPOLoss)`` mean the same thing.

A name that is not registered and has the form ``source:ClassName`` (``ms://org/repo:MyLoss``,
``hf://org/repo@v1:MyLoss``, ``/path/to/folder:MyLoss``) is a component of a hub plugin:
every registry hands it to the one resolver, ``twinkle.hub.plugin.resolve_component``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Generic, TypeVar, overload

from twinkle.utils.upper import import_upper

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Named classes of one kind (losses, optimizers, templates, ...).

    ``kind`` names the registry in error messages; ``base``, when given, is the
    class every entry must subclass. Registration is explicit: as a decorator
    (``@LOSSES.register`` or ``@LOSSES.register(name='grpo')``) or a call
    (``LOSSES.register(GRPOLoss)``); the name defaults to the class name.
    """

    def __init__(self, kind: str, base: type | None = None) -> None:
        self.kind = kind
        self.base = base
        self._classes: dict[str, T] = {}

    @overload
    def register(self, cls: T, *, name: str | None = None) -> T: ...

    @overload
    def register(self, cls: None = None, *, name: str | None = None) -> Callable[[T], T]: ...

    def register(self, cls: T | None = None, *, name: str | None = None) -> T | Callable[[T], T]:
        """Add ``cls`` under ``name`` (default: its class name); a name is taken only once."""
        if cls is None:
            return lambda c: self.register(c, name=name)
        self._check_class(cls)
        key = cls.__name__ if name is None else name
        if not isinstance(key, str) or not key:
            raise ValueError(f"{self.kind} names must be non-empty strings, got {key!r}")
        if ":" in key:
            raise ValueError(
                f"{self.kind} name {key!r} has a ':', which marks a plugin component "
                "(source:ClassName); register it under a name without one"
            )
        if self._classes.get(key, cls) is not cls:
            raise ValueError(
                f"{self.kind} name {key!r} is already taken by {self._classes[key].__qualname__}; "
                "register the new class under another name"
            )
        self._classes[key] = cls
        return cls

    def register_exported(self, module: ModuleType) -> None:
        """Register every class ``module.__all__`` exports that subclasses ``base`` (the base
        itself left out), so a package's new component needs no second list."""
        if self.base is None:
            raise TypeError(f"the {self.kind} registry has no base class to pick exports by")
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and value is not self.base and issubclass(value, self.base):
                self.register(value)

    def get(self, name_or_cls: str | T) -> T:
        """The class registered as ``name_or_cls``, or the class itself when one is given."""
        if isinstance(name_or_cls, type):
            self._check_class(name_or_cls)
            return name_or_cls
        if not isinstance(name_or_cls, str):
            raise TypeError(f"a {self.kind} is given by name or class, got {name_or_cls!r}")
        if name_or_cls not in self._classes and ":" in name_or_cls:
            return self._from_plugin(name_or_cls)
        if name_or_cls not in self._classes:
            known = ", ".join(sorted(self._classes)) or "(none registered)"
            raise ValueError(f"unknown {self.kind} {name_or_cls!r}; known: {known}")
        return self._classes[name_or_cls]

    def _from_plugin(self, reference: str) -> T:
        plugin = import_upper("twinkle.hub.plugin", "twinkle-data", f"{self.kind} {reference!r}")
        return plugin.resolve_component(reference, self.kind, self.base)

    def _check_class(self, cls: object) -> None:
        if not isinstance(cls, type):
            raise TypeError(f"a {self.kind} must be a class, got {cls!r}")
        if self.base is not None and not issubclass(cls, self.base):
            base = self.base.__qualname__
            raise TypeError(f"{cls.__qualname__} is not a {self.kind}: it must subclass {base}")

    def names(self) -> list[str]:
        return sorted(self._classes)

    def __contains__(self, name: object) -> bool:
        return name in self._classes
