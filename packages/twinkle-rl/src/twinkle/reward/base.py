"""Reward: the protocol every reward function follows.

``reward(trajectories, ground_truths) -> list[float]``: one float per
trajectory. A trajectory is a Trajectory or an InputFeature (a sampled
sequence's ``new_input_feature``) carrying ``messages``, whose last assistant
message is the completion, and ``user_data``, whose first dict holds the
ground truth the preprocessor stored (e.g. ``[{'answer': '42'}]``).
``ground_truths`` is for rewards that take references separately; rewards
that read ``user_data`` accept it left out or empty, as the user's documents call them
both ways.

In Ray mode ``GSM8KAccuracyReward(remote_group='reward')`` (any Reward, a user's subclass
included) lives on that group and ``reward(trajectories)`` runs there; the inputs may be
lazy results of other components, fetched by the worker. A reward is stateless and cheap,
so it is built once, on the group's first worker (``execute='first'``): N copies would add
an N-way fan-out to every call and win nothing on regular expressions. ``__call__`` slices
the trajectories (and ground truths) over the workers that hold the reward and
concatenates the scores, so an expensive reward (a reward model, running code) spreads over
the whole group by decorating its class ``@remote_class(execute='all')``. A subclass's
``__call__`` inherits this without a decorator of its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from twinkle.infra import remote_class, remote_function


@remote_class(execute="first")
class Reward(ABC):
    """Scores completions; subclasses implement ``__call__``."""

    @remote_function(dispatch="slice", collect="flatten")
    @abstractmethod
    def __call__(
        self, trajectories: Sequence[Any], ground_truths: Sequence[Any] | None = None
    ) -> list[float]:
        """One reward per trajectory, in order."""
