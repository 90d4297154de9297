"""Tokens drawn by a sampler on a Ray worker, heard in the server process as they are drawn.

A sampler in the server's process calls a request's ``on_token`` itself; on a Ray worker
that callable runs in the worker's process. There it is a ``RelayedTokens``: each token goes
into a Ray queue (``ray.util.queue.Queue``, an actor of no CPUs) that a thread of the server
reads, handing each token to the request's listener (the OpenAI stream) while the remote
call is still running. After the call returns, an end marker is put behind the worker's
tokens (each put returned before the call did), so every token is handed on before the
work's future resolves. One relayed call at a time: the sampler's worker thread serialises
them, which ``relay`` checks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
END = "end-of-relayed-call"


@dataclass(frozen=True)
class RelayedTokens:
    """A request's ``on_token`` on the worker: ``(row, token, pairs)`` into the queue."""

    queue: Any
    index: int

    def __call__(self, row: int, token: int, pairs: Any) -> None:
        self.queue.put((self.index, row, token, pairs))


class TokenRelay:
    """The queue between the sampler's workers and this process's listeners."""

    def __init__(self) -> None:
        from ray.util.queue import Queue

        self.queue = Queue(actor_options={"num_cpus": 0})
        self.in_flight = False  # a relayed remote call is running

    def listener(self, index: int) -> RelayedTokens:
        return RelayedTokens(self.queue, index)

    def relay(
        self, listeners: dict[int, Callable[[int, int, Any], None]], call: Callable[[], T]
    ) -> T:
        """``call()`` (the remote sample) while a thread hands each relayed token to
        ``listeners[index]``; returns once every token was handed on."""
        if self.in_flight:
            raise RuntimeError("one relayed sample at a time (the sampler's worker runs them)")
        forwarder = threading.Thread(target=self._forward, args=(listeners,), daemon=True)
        forwarder.start()
        self.in_flight = True
        try:
            return call()
        finally:
            self.in_flight = False
            self.queue.put(END)
            forwarder.join()

    def _forward(self, listeners: dict[int, Callable[[int, int, Any], None]]) -> None:
        while (item := self.queue.get()) != END:
            index, row, token, pairs = item
            listeners[index](row, token, pairs)
