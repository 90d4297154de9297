"""EnvPool: one env per trajectory of a rollout batch, stepped together.

An env that raises is caught here and reported as an :class:`EnvFailure` naming the
trajectory and the turn; the other trajectories go on. Steps of different envs run on a
thread pool, so envs that wait (a sandboxed program, a remote service) wait together. In
Ray mode the pool is a component of its own (``EnvPool(..., remote_group='envs')``), so
the envs run on their own DeviceGroup, away from the sampler and the trainer.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from twinkle.data_format import Message, Tool
from twinkle.env.base import Env, StepResult, as_messages
from twinkle.infra import remote_class, remote_function
from twinkle.utils import get_logger

logger = get_logger()


@dataclass
class Episode:
    """A started episode: the first observation, the env's tools and its task's user data."""

    observation: list[Message]
    tools: list[Tool] | None = None
    user_data: dict[str, Any] = field(default_factory=dict)


@dataclass
class EnvFailure:
    """An env that raised: which trajectory, at which turn (0 is ``reset``), and why."""

    trajectory: int
    turn: int
    error: str

    def __str__(self) -> str:
        return f"env of trajectory {self.trajectory} failed at turn {self.turn}: {self.error}"


@remote_class(execute="first")
class EnvPool:
    """Builds envs with ``env_factory(**env_kwargs)`` (an Env subclass or a function), one
    per trajectory, reused across batches. ``max_workers`` bounds the threads that step
    envs at once (1 steps them one after another in this thread)."""

    def __init__(
        self,
        env_factory: Callable[..., Env],
        *,
        max_workers: int = 8,
        **env_kwargs: Any,
    ) -> None:
        if not callable(env_factory):
            raise TypeError(
                f"env_factory must be an Env subclass or a function returning an Env, got "
                f"{type(env_factory).__name__}"
            )
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.env_factory = env_factory
        self.env_kwargs = env_kwargs
        self.max_workers = max_workers
        self.envs: list[Env] = []
        self._turns: list[int] = []

    @remote_function(dispatch="all", execute="first", collect="first")
    def reset(self, tasks: Sequence[Mapping[str, Any]]) -> list[Episode | EnvFailure]:
        """Start one episode per task, trajectory ``i`` on env ``i``."""
        tasks = list(tasks)
        while len(self.envs) < len(tasks):
            self.envs.append(self._build())
        self._turns = [0] * len(tasks)
        return self._run({i: (self._reset_one, task) for i, task in enumerate(tasks)})

    @remote_function(dispatch="all", execute="first", collect="first")
    def step(self, actions: Mapping[int, Message]) -> dict[int, StepResult | EnvFailure]:
        """Step the envs of the trajectories in ``actions`` (trajectory -> assistant turn)."""
        for index in actions:
            if not 0 <= index < len(self._turns):
                raise ValueError(
                    f"trajectory {index} has no episode: reset started {len(self._turns)}"
                )
            self._turns[index] += 1
        outcomes = self._run({i: (self._step_one, m) for i, m in actions.items()})
        return dict(zip(actions, outcomes, strict=True))

    @remote_function(dispatch="all", execute="first", collect="first")
    def close(self) -> None:
        """Close every env (a failing close is logged, the others still close)."""
        for index, env in enumerate(self.envs):
            try:
                env.close()
            except Exception as err:  # noqa: BLE001 - one env's cleanup must not stop the rest
                logger.warning(f"closing the env of trajectory {index} failed: {err!r}")
        self.envs = []

    # ---- internals ---------------------------------------------------------------------

    def _build(self) -> Env:
        env = self.env_factory(**self.env_kwargs)
        if not isinstance(env, Env):
            raise TypeError(
                f"env_factory returned {type(env).__name__}, not an Env; subclass twinkle.env.Env"
            )
        return env

    def _reset_one(self, index: int, task: Mapping[str, Any]) -> Episode:
        env = self.envs[index]
        observation = as_messages(env.reset(task), f"{type(env).__name__}.reset")
        return Episode(observation, env.tools, dict(env.user_data))

    def _step_one(self, index: int, message: Message) -> StepResult:
        env = self.envs[index]
        result = env.step(message)
        if not isinstance(result, StepResult):
            raise TypeError(
                f"{type(env).__name__}.step must return a StepResult, got {type(result).__name__}"
            )
        result.observation = as_messages(result.observation, f"{type(env).__name__}.step")
        return result

    def _run(self, calls: dict[int, tuple[Callable, Any]]) -> list[Any]:
        def guarded(index: int) -> Any:
            function, argument = calls[index]
            try:
                return function(index, argument)
            except Exception as err:  # noqa: BLE001 - reported per trajectory, as the issue asks
                turn = self._turns[index] if index < len(self._turns) else 0
                failure = EnvFailure(index, turn, f"{type(err).__name__}: {err}")
                logger.warning(f"{failure}\n{traceback.format_exc(limit=3)}")
                return failure

        indices = list(calls)
        if self.max_workers == 1 or len(indices) <= 1:
            return [guarded(i) for i in indices]
        with ThreadPoolExecutor(min(self.max_workers, len(indices))) as executor:
            return list(executor.map(guarded, indices))
