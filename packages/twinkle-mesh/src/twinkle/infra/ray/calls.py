"""A remote call's results and failures: fetched with the caller's line, or checked later.

``fetch`` turns a worker's :class:`Failure` or death into the caller's error.
:class:`PendingCalls` holds the status refs of lazy calls nobody has waited
for, so that a failure is raised (once) at the next remote call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import ray
from ray.exceptions import RayActorError, RayError

from twinkle.infra.ray.errors import Before, CallSite, Failure, RemoteError, dead_worker_error
from twinkle.infra.state import get_worker_group

# The driver's runtime sets this (the layer above may not be imported from here): called with
# (group, rank, cause) when a worker has died, so that the group's other workers are stopped.
on_dead_worker: Callable[[str, int, str], None] | None = None


class CallInfo:
    """Which call produced a result: for error messages (component.method, group, driver line)."""

    __slots__ = ("what", "group", "site", "actor_ids")

    def __init__(self, what: str, group: str, site: CallSite | None, actor_ids: Sequence[str]):
        self.what, self.group, self.site, self.actor_ids = what, group, site, list(actor_ids)

    def __reduce__(self):
        return CallInfo, (self.what, self.group, self.site, self.actor_ids)


def fetch(refs: list, ranks: Sequence[int], info: CallInfo, before: Before | None = None) -> list:
    """``ray.get`` the workers' results; a Failure or a dead worker becomes the caller's error
    (``before``: the later call it is reported at, for a lazy call's failure).

    ``ray.get`` returns as soon as one result is an error, so a worker that dies while
    its peers wait in a collective fails the call at once instead of hanging it.
    """
    try:
        values = ray.get(refs)
    except RayActorError as exc:
        raise _dead(exc, ranks, info) from None
    except RayError as exc:
        raise RemoteError(
            f"{info.what} on group {info.group!r} (called at {info.site}) failed in Ray: {exc}",
            group=info.group,
        ) from exc
    for value in values:
        if isinstance(value, Failure):
            raise value.error(info.what, info.group, info.site, before)
    return values


def _dead(exc: RayActorError, ranks: Sequence[int], info: CallInfo) -> RemoteError:
    actor_id = getattr(exc, "actor_id", None)
    rank = ranks[0]
    for index, candidate in enumerate(info.actor_ids):
        if candidate == actor_id:
            rank = ranks[index]
    cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if on_dead_worker is not None and get_worker_group() is None:
        on_dead_worker(info.group, rank, cause)
    return dead_worker_error(info.what, info.group, rank, info.site, cause)


class PendingCalls:
    """The status refs of the driver's lazy calls whose errors are not yet seen."""

    def __init__(self) -> None:
        self.entries: list[tuple[list, list[int], CallInfo]] = []

    def add(self, statuses: list, ranks: list[int], info: CallInfo) -> None:
        self.entries.append((statuses, ranks, info))

    def raise_earlier_failures(self, timeout: float = 0, before: Before | None = None) -> None:
        """Raise the error of a finished lazy call that failed (each is reported once);
        ``timeout`` is how long to wait for calls still running; ``before`` is the call about
        to run (what, call site), which the error says did not run."""
        if not self.entries:
            return
        refs = [ref for statuses, _, _ in self.entries for ref in statuses]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout, fetch_local=False)
        done = set(ready)
        still, finished = [], []
        for entry in self.entries:
            (finished if all(r in done for r in entry[0]) else still).append(entry)
        self.entries = still
        for statuses, ranks, info in finished:
            fetch(statuses, ranks, info, before)

    def forget(self, info: CallInfo) -> None:
        """Drop the pending status of a call whose failure its caller already got (by
        reading its result), so that the next call does not report it again."""
        self.entries = [entry for entry in self.entries if entry[2] is not info]
