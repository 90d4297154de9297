"""How a failure on a Ray worker reaches the driver: the worker's rank and the driver's line.

A worker never lets an exception escape a call: it returns a :class:`Failure`
instead, so the driver (or the worker that consumes a lazy result) decides how
to report it, with the call site that Ray alone would not know. Nothing here
imports Ray.
"""

from __future__ import annotations

import linecache
import pickle
import sys
import traceback
from dataclasses import dataclass


class RemoteError(RuntimeError):
    """A call on a remote component failed on a worker, or a worker died.

    The message names the component and method, the worker's rank and group and
    the driver line that made the call, then the worker's traceback. The
    original exception, when it could be sent back, is ``__cause__``.
    """

    def __init__(self, message: str, *, rank: int | None = None, group: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.group = group


class EarlierCallError(RemoteError):
    """A lazy call failed after it returned; raised at the next remote call, which did not run.

    The message leads with the call that failed and the driver line that made it, then says
    which call it is reported at (``reported_at``) and that that call was not at fault.
    ``failed_call`` is the failed call's ``Component.method``.
    """

    def __init__(
        self, message: str, *, failed_call: str, reported_at: str, rank: int, group: str
    ) -> None:
        super().__init__(message, rank=rank, group=group)
        self.failed_call, self.reported_at = failed_call, reported_at


@dataclass(frozen=True)
class CallSite:
    """The driver line that made a remote call (captured cheaply; formatted only on failure)."""

    filename: str
    lineno: int
    function: str

    @staticmethod
    def here() -> CallSite:
        """The innermost frame outside twinkle's execution layer."""
        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(
            "twinkle.infra"
        ):
            frame = frame.f_back
        return CallSite(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)

    def __str__(self) -> str:
        line = linecache.getline(self.filename, self.lineno).strip()
        where = f"{self.filename}:{self.lineno} in {self.function}"
        return f"{where}: {line}" if line else where


Before = tuple[str, CallSite | None]
"""The call a lazy call's failure is reported at: what it calls, and its driver line."""


@dataclass(frozen=True)
class Failure:
    """An exception raised by a component on a worker, as a plain value."""

    rank: int
    exc_type: str
    message: str
    traceback: str
    exception: BaseException | None

    @staticmethod
    def capture(rank: int, exc: BaseException) -> Failure:
        try:  # the exception itself travels only if it can be unpickled in the driver
            pickle.loads(pickle.dumps(exc))
            kept: BaseException | None = exc
        except Exception:
            kept = None
        text = "".join(traceback.format_exception(exc))
        return Failure(rank, type(exc).__name__, str(exc), text, kept)

    @property
    def is_stop(self) -> bool:
        return self.exc_type == "StopIteration"

    def error(
        self, what: str, group: str, site: CallSite | None, before: Before | None = None
    ) -> BaseException:
        """The exception the caller raises: StopIteration as is, anything else a RemoteError;
        an EarlierCallError when reported ``before`` another call (a lazy call's failure)."""
        if self.is_stop:
            return StopIteration()
        called = f" (called at {site})" if site else ""
        headline = (
            f"{what} failed on worker rank {self.rank} of group {group!r}{called}: "
            f"{self.exc_type}: {self.message}"
        )
        worker = f"\n--- traceback on the worker ---\n{self.traceback}"
        if before is None:
            error = RemoteError(headline + worker, rank=self.rank, group=group)
        else:
            next_call = f"{before[0]} at {before[1]}" if before[1] else before[0]
            note = (
                f"\n{what} ran lazily (the driver did not wait for it), so its failure is "
                f"reported before the next remote call, {next_call}, which did not run and is not "
                "at fault. To stop at the failing call itself, pass sync=True to its "
                "remote_function or twinkle.initialize(..., lazy_collect=False)."
            )
            error = EarlierCallError(
                headline + note + worker,
                failed_call=what,
                reported_at=next_call,
                rank=self.rank,
                group=group,
            )
        error.__cause__ = self.exception
        return error


def dead_worker_error(
    what: str, group: str, rank: int, site: CallSite | None, cause: str
) -> RemoteError:
    called = f" (called at {site})" if site else ""
    return RemoteError(
        f"worker rank {rank} of group {group!r} died during {what}{called}. The group's other "
        "workers were stopped, since its torch.distributed group cannot continue without it; "
        f"call twinkle.initialize(...) again to start new workers. Ray said: {cause}",
        rank=rank,
        group=group,
    )
