"""``@remote_class`` and ``@remote_function``: mark components and methods that can run remotely.

In local mode the marks cost nothing at call time. ``remote_function`` only
attaches a :class:`RemoteSpec` to the function and returns the same function
object, so calling a marked method is a plain method call. ``remote_class``
touches construction alone: it strips the ``remote_group=`` keyword before the
user's ``__init__`` runs and keeps it as ``self.remote_group``. It wraps the
class's ``__init__`` (and, through ``__init_subclass__``, the ``__init__`` of
every subclass that defines one) rather than replacing the class, so the class
object, its MRO, ``super()`` and pickling stay exactly as the user wrote them.

``_intercept_construction`` is the one place that changes how a remote class
is built: in the ray-mode driver, its ``__new__`` returns a RemoteComponent
(``twinkle.infra.ray.component``) instead of an instance when a
``remote_group`` is given; Python then skips ``__init__``, which runs on the
group's workers instead. Everywhere else ``__new__`` builds the object as usual.

A :class:`WirePolicy` on the spec (``@remote_function(wire=WirePolicy(...))``) says that
the method may also be called over HTTP and what may cross: it is the one declaration
twinkle-server's dispatch table and twinkle-client's generated proxies are both built from.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from twinkle.infra.collect import Collector, check_collect_mode
from twinkle.infra.dispatch import Dispatcher, check_dispatch_mode
from twinkle.infra.state import get_mode, get_worker_group

EXECUTE_MODES = ("first", "all")
RETURN_KINDS = ("json", "model_output")
_STRIPS_REMOTE_GROUP = "__twinkle_strips_remote_group__"

C = TypeVar("C", bound=type)
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class WirePolicy:
    """What of a remote method may cross HTTP: present means a client may call it.

    The method's own signature gives the parameters; the fields say how each travels.
    ``named``: parameters that name a component on the server's allow-list (a client sends
    a class's name, never an object). ``batch``: the parameter holding rows of data.
    ``positive``: numbers refused unless finite and > 0 (``clip_grad_norm(max_norm=-1)``
    would flip every gradient). ``returns='model_output'``: the result is a ModelOutput
    (else plain JSON). ``client_drops``: keywords a client accepts for local compatibility
    and never sends (the server uses its own model's tokenizer). ``server_names``:
    parameters a client passes although the server would otherwise supply them (the
    display name of a new adapter). ``own_route``: the call has its own route, not
    ``/model/<method>``.
    """

    named: tuple[str, ...] = ()
    batch: str | None = None
    positive: tuple[str, ...] = ()
    returns: str = "json"
    client_drops: tuple[str, ...] = ()
    server_names: tuple[str, ...] = ()
    own_route: bool = False

    def __post_init__(self) -> None:
        if self.returns not in RETURN_KINDS:
            raise ValueError(
                f"WirePolicy returns must be one of {RETURN_KINDS}, got {self.returns!r}"
            )

    def check_parameters(self, fn: Callable[..., Any]) -> None:
        """Every parameter the policy names is one of ``fn``'s (caught where it is declared)."""
        known = set(inspect.signature(fn).parameters)
        named = [*self.named, *self.positive, *self.client_drops, *self.server_names]
        if self.batch is not None:
            named.append(self.batch)
        takes_kwargs = any(
            p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values()
        )
        unknown = [name for name in named if name not in known]
        if unknown and not (takes_kwargs and set(unknown) <= set(self.client_drops)):
            raise ValueError(
                f"the wire policy of {fn.__qualname__} names {unknown}, which it does not take"
            )


@dataclass(frozen=True)
class RemoteSpec:
    """How a method runs on a component's workers: the ``@remote_function`` arguments.

    ``lazy_collect=None`` means the default given to ``twinkle.initialize``; ``wire=None``
    means the method is not offered over HTTP.
    """

    dispatch: str | Dispatcher = "slice"
    execute: str = "all"
    collect: str | Collector = "none"
    sync: bool = False
    lazy_collect: bool | None = None
    wire: WirePolicy | None = None


@dataclass(frozen=True)
class RemoteClassSpec:
    """Where a component is built: on the first worker of its group, or on every worker."""

    execute: str = "first"


def _check_execute(execute: str) -> None:
    if execute not in EXECUTE_MODES:
        raise ValueError(
            f"unknown execute mode {execute!r}; use one of {', '.join(map(repr, EXECUTE_MODES))}"
        )


def remote_function(
    *,
    dispatch: str | Dispatcher = "slice",
    execute: str = "all",
    collect: str | Collector = "none",
    sync: bool = False,
    lazy_collect: bool | None = None,
    wire: WirePolicy | None = None,
) -> Callable[[F], F]:
    """Mark a method of a remote class: how inputs are dispatched and outputs collected.

    The modes are checked here, at decoration time. The decorated function is
    returned unchanged, with the spec in ``fn.__twinkle_remote__``. ``wire`` offers the
    method over HTTP (see :class:`WirePolicy`).
    """
    check_dispatch_mode(dispatch)
    _check_execute(execute)
    check_collect_mode(collect)
    if not isinstance(sync, bool):
        raise TypeError(f"sync must be True or False, got {sync!r}")
    if lazy_collect is not None and not isinstance(lazy_collect, bool):
        raise TypeError(f"lazy_collect must be True, False or None, got {lazy_collect!r}")
    if wire is not None and not isinstance(wire, WirePolicy):
        raise TypeError(f"wire must be a WirePolicy or None, got {wire!r}")
    spec = RemoteSpec(dispatch, execute, collect, sync, lazy_collect, wire)

    def mark(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"@remote_function(...) decorates a method, got {fn!r}")
        if wire is not None:
            wire.check_parameters(fn)
        fn.__twinkle_remote__ = spec
        return fn

    return mark


def find_remote_spec(cls: type, name: str) -> RemoteSpec | None:
    """The ``@remote_function`` spec of ``cls.name``, inherited through the MRO: a subclass
    that overrides a remote method without decorating it again (a Reward's ``__call__``)
    keeps the spec of the method it overrides; None when no class in the MRO marks it."""
    for klass in cls.__mro__:
        spec = getattr(getattr(klass, name, None), "__twinkle_remote__", None)
        if spec is not None:
            return spec
    return None


def _check_remote_group(remote_group: object) -> None:
    if not isinstance(remote_group, str):
        raise TypeError(
            f"remote_group must be the name of a DeviceGroup (a str), got {remote_group!r}"
        )


def _strip_remote_group(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap ``__init__`` so that it takes ``remote_group=`` and keeps it on the instance."""
    if getattr(init, _STRIPS_REMOTE_GROUP, False):
        return init

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, remote_group: str | None = None, **kwargs: Any) -> None:
        # A subclass's wrapper runs first and records the group; the base wrappers it
        # reaches through super().__init__ see remote_group=None and leave it alone.
        if remote_group is not None:
            _check_remote_group(remote_group)
            self.remote_group = remote_group
        init(self, *args, **kwargs)

    setattr(__init__, _STRIPS_REMOTE_GROUP, True)
    return __init__


def _builds_remotely(remote_group: str) -> bool:
    """True in the ray-mode driver for a component given a group; a worker builds in process."""
    if get_mode() != "ray":
        return False
    worker_group = get_worker_group()
    if worker_group is not None and remote_group != worker_group:
        raise ValueError(
            f"a component for group {remote_group!r} was built on a worker of group "
            f"{worker_group!r}; build components of other groups in the driver"
        )
    return worker_group is None


def _intercept_new(cls: type) -> None:
    """Give ``cls`` a ``__new__`` that hands construction to the ray backend when it applies."""
    previous = cls.__new__

    def __new__(klass: type, *args: Any, **kwargs: Any) -> Any:
        remote_group = kwargs.get("remote_group")
        if remote_group is not None and _builds_remotely(remote_group):
            _check_remote_group(remote_group)
            # Here, not at the top: Ray is an optional extra, and component imports this module.
            from twinkle.infra.ray.component import build_remote

            kwargs.pop("remote_group")
            return build_remote(klass, args, kwargs, remote_group)
        if previous is object.__new__:
            return object.__new__(klass)
        kwargs.pop("remote_group", None)
        return previous(klass, *args, **kwargs)

    # inspect.signature(cls) reads a class's own __new__ first: keep showing the user's __init__.
    __new__.__signature__ = inspect.signature(cls.__init__)
    cls.__new__ = staticmethod(__new__)


def _intercept_construction(cls: type) -> None:
    """Wrap ``cls.__init__`` now and each subclass's own ``__init__`` when it is defined."""
    cls.remote_group = None
    cls.__init__ = _strip_remote_group(cls.__init__)
    _intercept_new(cls)
    previous = cls.__dict__.get("__init_subclass__")

    def __init_subclass__(sub: type, **kwargs: Any) -> None:
        if previous is None:
            super(cls, sub).__init_subclass__(**kwargs)
        else:
            previous.__get__(None, sub)(**kwargs)
        if "__init__" in sub.__dict__:
            sub.__init__ = _strip_remote_group(sub.__init__)

    cls.__init_subclass__ = classmethod(__init_subclass__)


def remote_class(*, execute: str = "first") -> Callable[[C], C]:
    """Mark a component class that Ray and HTTP modes can build on a DeviceGroup's workers.

    ``execute='first'`` builds one instance on the group's first worker
    (datasets, dataloaders); ``'all'`` builds one on every worker (models).
    Every constructor of the class and its subclasses accepts ``remote_group=``
    (the DeviceGroup name), stored as ``self.remote_group`` (None when not
    given) before the user's ``__init__`` runs. In local mode, or without
    ``remote_group``, the object is built in process: ``A(...)`` is an ``A``.
    A subclass that overrides ``__init_subclass__`` must call
    ``super().__init_subclass__()`` for its own subclasses to accept
    ``remote_group``.
    """
    _check_execute(execute)
    spec = RemoteClassSpec(execute)

    def mark(cls: C) -> C:
        if not isinstance(cls, type):
            raise TypeError(f"@remote_class(...) decorates a class, got {cls!r}")
        if getattr(cls, "__twinkle_remote_class__", None) is None:
            _intercept_construction(cls)
        cls.__twinkle_remote_class__ = spec
        return cls

    return mark
