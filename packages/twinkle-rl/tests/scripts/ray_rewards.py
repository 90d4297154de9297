"""Components for the Ray reward tests, importable by the Ray workers (the tests put this
folder on their PYTHONPATH): user-written rewards, and a source of lazy trajectories."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twinkle import remote_class, remote_function
from twinkle.mesh import Platform
from twinkle.reward import Reward


def trajectory(completion: str, answer: str) -> dict:
    return {
        "messages": [
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": completion},
        ],
        "user_data": [{"answer": answer}],
    }


TRAJECTORIES = [
    trajectory("2 + 2 = 4\n#### 4", "4"),
    trajectory("I think it is five.\n#### 5", "4"),
    trajectory("no final line", "4"),
    trajectory("#### 1,000", "1000"),
    trajectory("#### 3.0", "3"),
]


class BrokenReward(Reward):
    """A user's reward with a bug: no decorator, it inherits the remote ``__call__``."""

    def __call__(
        self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None
    ) -> list[float]:
        raise ValueError(f"cannot score {len(trajectories)} trajectories")


@remote_class(execute="all")
class RankReward(Reward):
    """Scores each trajectory with the rank of the worker that saw it: shows the slicing."""

    def __call__(
        self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None
    ) -> list[float]:
        return [float(Platform.get_rank())] * len(trajectories)


@remote_class(execute="all")
class TrajectorySource:
    """Hands out the test trajectories, half per worker, as a lazy result."""

    @remote_function(dispatch="all", collect="flatten", lazy_collect=True)
    def trajectories(self) -> list[dict]:
        rank, size = Platform.get_rank(), Platform.get_world_size()
        return TRAJECTORIES[rank::size]
