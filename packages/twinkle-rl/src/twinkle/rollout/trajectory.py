"""RolloutTrajectory: one multi-turn episode as the trainer needs it.

``tokens`` is the whole sequence: the prompt, then each sampled turn exactly as sampled and
each observation as the template rendered it. ``loss_mask[t]`` is 1 where the model sampled
token ``t`` (only those train) and ``logprobs[t]`` is the sampler's logprob of it (0.0 on the
other tokens). ``input_feature()`` gives the InputFeature for ``forward_backward`` (labels
on the sampled tokens, -100 elsewhere) and ``sampled_logprobs()`` the matching
``old_logps`` row (the label tokens' values, in order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from twinkle.data_format import InputFeature, Message, Tool

IGNORE_INDEX = -100
StopReason = Literal["done", "max_turns", "max_tokens", "length", "env_error", "abort"]


@dataclass
class RolloutTrajectory:
    """One episode (see the module docstring). ``id`` is its index in the rollout's result,
    ``task_index`` the task it ran and ``sample_index`` its place among that task's
    samples. ``reward`` sums the env's rewards; ``error`` says why an env failed."""

    id: int
    task_index: int
    sample_index: int
    tokens: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_length: int
    messages: list[Message]
    tools: list[Tool] | None = None
    user_data: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0
    turns: int = 0
    stop_reason: StopReason | None = None
    error: str | None = None
    infos: list[dict[str, Any]] = field(default_factory=list)
    model_version: int | None = None

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def num_sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    def extend(self, tokens: list[int], *, sampled: bool, logprobs: list[float] | None = None):
        """Append tokens the model sampled (with their logprobs) or the env's tokens."""
        if sampled and (logprobs is None or len(logprobs) != len(tokens)):
            raise ValueError("sampled tokens need one logprob each")
        self.tokens += tokens
        self.loss_mask += [int(sampled)] * len(tokens)
        self.logprobs += logprobs if sampled else [0.0] * len(tokens)

    def input_feature(self) -> InputFeature:
        ids = np.asarray(self.tokens, dtype=np.int64)
        labels = np.where(np.asarray(self.loss_mask, dtype=bool), ids, IGNORE_INDEX)
        return InputFeature(
            input_ids=ids,
            labels=labels,
            position_ids=np.arange(len(ids), dtype=np.int64),
            messages=self.messages,
            tools=self.tools,
            user_data=[self.user_data] if self.user_data else [],
        )

    def sampled_logprobs(self) -> list[float]:
        return [lp for lp, m in zip(self.logprobs, self.loss_mask, strict=True) if m]
