"""AsyncRollouts: rollouts on a thread of their own, at most ``max_staleness`` policy
versions behind the trainer.

The trainer's loop stays the user's::

    with AsyncRollouts(produce, sync_weights, max_staleness=1) as rollouts:
        for step in range(steps):
            batch = rollouts.next_batch()       # waits only if no batch is ready
            model.forward_backward(inputs=..., old_logps=<the sampler's logprobs>, ...)
            model.clip_grad_and_step()
            rollouts.publish()                  # sync the weights; the policy version + 1

``produce(i)`` makes batch ``i`` with the sampler (rollouts, rewards, advantages). Batch
``i`` starts only once the policy version is at least ``i - max_staleness``, so it is
trained on at most ``max_staleness`` versions after the weights that sampled it; a batch
that is staler when the trainer asks (the trainer published more than once for it) is
dropped and counted, never returned. ``publish`` runs ``sync_weights`` between the
producer's batches (a batch is sampled by one version of the weights), then raises the
version. ``max_staleness=0`` is synchronous RL: sample, train, sync, in that order, the same
calls as the plain loop, so the same results.

Off-policy correction: pass the sampler's logprobs as ``old_logps``. The policy losses'
ratio is then ``exp(logp_policy - logp_sampler)``, the importance ratio against the
policy that really sampled (a stale one here); GRPOLoss clips it to
``[1 - epsilon, 1 + epsilon_high]`` and CISPOLoss caps it as a weight (truncated IS), and
``PolicyMetric`` reports it (``policy/ratio_mean``, ``ratio_max``, ``clip_fraction``,
``kl_old``). ``VersionedBatch.staleness`` says how old each batch was.

The producer is a Python thread: with an in-process TorchSampler it overlaps with training
only where torch releases the GIL; with a Ray or remote sampler the sampling runs
elsewhere and the overlap is real.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from twinkle.utils import get_logger

logger = get_logger()


@dataclass
class VersionedBatch:
    """Batch ``index`` as ``produce`` made it, sampled by policy ``version`` and handed to
    the trainer ``staleness`` versions later."""

    index: int
    version: int
    data: Any
    staleness: int = 0


class AsyncRollouts:
    """See the module docstring. ``num_batches`` stops the producer after that many
    (None: until ``close``). ``trainer_wait_s`` and ``producer_wait_s`` add up the time each
    side waited for the other; ``dropped`` counts the batches too stale to train on."""

    def __init__(
        self,
        produce: Callable[[int], Any],
        sync_weights: Callable[[], Any],
        max_staleness: int,
        *,
        num_batches: int | None = None,
    ) -> None:
        if (
            not isinstance(max_staleness, int)
            or isinstance(max_staleness, bool)
            or max_staleness < 0
        ):
            raise ValueError(f"max_staleness must be an int >= 0, got {max_staleness!r}")
        if num_batches is not None and num_batches < 1:
            raise ValueError(f"num_batches must be >= 1 or None, got {num_batches}")
        self.produce, self.sync_weights = produce, sync_weights
        self.max_staleness, self.num_batches = max_staleness, num_batches
        self.version = 0
        self.dropped = 0
        self.trainer_wait_s = self.producer_wait_s = self.sync_s = 0.0
        self._ready: deque[VersionedBatch] = deque()
        self._changed = threading.Condition()
        self._sampling = threading.Lock()  # held while a batch is sampled, and by a sync
        self._stopping = False
        self._finished = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="twinkle-rollouts", daemon=True)
        self._thread.start()

    # ---- the trainer's side ---------------------------------------------------------------

    def next_batch(self, timeout_s: float | None = None) -> VersionedBatch:
        """The oldest batch still within the staleness bound; waits for one if none is
        ready. Raises the producer's error, StopIteration after the last batch, and
        TimeoutError after ``timeout_s``."""
        start = time.perf_counter()
        with self._changed:
            while True:
                self._drop_stale()
                if self._ready:
                    batch = self._ready.popleft()
                    batch.staleness = self.version - batch.version
                    self.trainer_wait_s += time.perf_counter() - start
                    self._changed.notify_all()
                    return batch
                if self._error is not None:
                    raise RuntimeError(
                        f"the rollout producer failed: {self._error!r}"
                    ) from self._error
                if self._finished:
                    raise StopIteration("the rollout producer made all its batches")
                left = None if timeout_s is None else timeout_s - (time.perf_counter() - start)
                if left is not None and left <= 0:
                    raise TimeoutError(f"no rollout batch within {timeout_s} s")
                self._changed.wait(left)

    def publish(self) -> None:
        """After an optimizer step: sync the new weights to the sampler between two of the
        producer's batches, then count a new policy version."""
        start = time.perf_counter()
        with self._sampling:
            waited = time.perf_counter() - start
            self.sync_weights()
            # Raised before the next batch can start, so it is tagged with these weights.
            with self._changed:
                self.trainer_wait_s += waited
                self.sync_s += time.perf_counter() - start - waited
                self.version += 1
                self._changed.notify_all()

    @contextmanager
    def sampler_paused(self) -> Iterator[None]:
        """Hold the producer between two batches, so the caller may use the sampler
        (an evaluation) without sharing it; the producer goes on afterwards."""
        with self._sampling:
            yield

    def close(self) -> None:
        """Stop the producer after its current batch and wait for it."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._thread.join()

    def __enter__(self) -> AsyncRollouts:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- the producer's side --------------------------------------------------------------

    def _run(self) -> None:
        index = 0
        try:
            while self.num_batches is None or index < self.num_batches:
                if not self._wait_for_version(index - self.max_staleness):
                    return
                with self._sampling:
                    version = self.version
                    data = self.produce(index)
                with self._changed:
                    self._ready.append(VersionedBatch(index, version, data))
                    self._changed.notify_all()
                index += 1
        except BaseException as err:  # noqa: BLE001 - handed to the trainer's next_batch
            with self._changed:
                self._error = err
                self._changed.notify_all()
        finally:
            with self._changed:
                self._finished = True
                self._changed.notify_all()

    def _wait_for_version(self, version: int) -> bool:
        """Wait until the policy is at ``version`` (False when closing meanwhile)."""
        start = time.perf_counter()
        with self._changed:
            while self.version < version and not self._stopping:
                self._changed.wait()
            self.producer_wait_s += time.perf_counter() - start
            return not self._stopping

    def _drop_stale(self) -> None:
        while self._ready and self.version - self._ready[0].version > self.max_staleness:
            batch = self._ready.popleft()
            self.dropped += 1
            logger.warning(
                f"rollout batch {batch.index} is {self.version - batch.version} policy versions "
                f"old, over max_staleness={self.max_staleness}: dropped, not trained on"
            )
