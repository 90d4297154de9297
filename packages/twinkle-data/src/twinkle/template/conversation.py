"""From a Trajectory (or a plain dict row) to what a chat template renders: message and
tool dicts, plus the positions of the assistant turns whose tokens are trained."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from pydantic import ValidationError

from twinkle.data_format import Trajectory
from twinkle.template.errors import EncodeError
from twinkle.template.rendering import template_inputs

TrainTurns: TypeAlias = Literal["all", "last"] | Sequence[int]
"""Which assistant turns carry labels: ``'all'``, ``'last'``, or indices into the list of
assistant turns (0 is the first assistant reply, -1 the last)."""

_TRAJECTORY_KEYS = ("messages", "tools", "user_data")


@dataclass(frozen=True)
class Conversation:
    """One trajectory ready to render. ``messages`` and ``tools`` are what the chat
    template sees (``template_inputs``, with the default system prompt applied);
    ``assistants`` are the positions of the assistant messages in them, and ``trained``
    the assistant turns to label, as indices into ``assistants`` (empty for a generation
    prompt)."""

    trajectory: Trajectory
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    assistants: tuple[int, ...]
    trained: tuple[int, ...]


def check_train_turns(train_turns: object) -> TrainTurns:
    """``train_turns`` itself, or a TypeError that says which values are accepted."""
    if isinstance(train_turns, str):
        if train_turns in ("all", "last"):
            return train_turns
    elif (
        isinstance(train_turns, Sequence)
        and len(train_turns) > 0
        and all(isinstance(i, int) and not isinstance(i, bool) for i in train_turns)
    ):
        return tuple(train_turns)
    raise TypeError(
        "train_turns must be 'all', 'last' or a non-empty list of assistant-turn indices such "
        f"as [0, -1], got {train_turns!r}"
    )


def to_trajectory(item: Trajectory | Mapping[str, Any], index: int) -> Trajectory:
    """A Trajectory as is; a dict row is validated from its ``messages``, ``tools`` and
    ``user_data`` keys (other columns belong to the dataset, not the template). Keys
    holding None count as absent, as they do in the rows of an Arrow-backed dataset."""
    if isinstance(item, Trajectory):
        return item
    if not isinstance(item, Mapping):
        raise EncodeError(
            index, f"expected a Trajectory or a dict with 'messages', got {type(item).__name__}"
        )
    if item.get("messages") is None:
        raise EncodeError(
            index,
            f"has no 'messages' (keys: {', '.join(map(str, item)) or 'none'}); map the dataset "
            "with a Preprocessor that produces messages before encoding",
        )
    data = {key: _without_none(item[key]) for key in _TRAJECTORY_KEYS if item.get(key) is not None}
    try:
        return Trajectory.model_validate(data)
    except ValidationError as err:
        raise EncodeError(index, f"is not a valid trajectory: {err}") from err


def _without_none(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _without_none(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_none(item) for item in value]
    return value


def prepare(
    trajectory: Trajectory,
    index: int,
    *,
    add_generation_prompt: bool,
    train_turns: TrainTurns,
    default_system: str | None,
) -> Conversation:
    """Check the turn order for the task and pick the trained turns.

    Training needs the conversation to end with an assistant reply; a generation prompt
    must not end with one (the template opens a new assistant turn after it).
    """
    messages = [message.to_openai() for message in trajectory.messages]
    if not messages:
        raise EncodeError(index, "has no messages; a trajectory needs at least one message")
    last = messages[-1]["role"]
    if add_generation_prompt and last == "assistant":
        raise EncodeError(
            index,
            "ends with an assistant message, but add_generation_prompt=True opens a new "
            "assistant turn after it; drop the final reply to make a prompt, or encode with "
            "add_generation_prompt=False to train on it",
        )
    if not add_generation_prompt and last != "assistant":
        raise EncodeError(
            index,
            f"ends with a {last!r} message, so there is no assistant reply to train on; add "
            "the reply, or encode with add_generation_prompt=True to make an RL prompt",
        )
    if default_system is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": default_system})
    tools = None if trajectory.tools is None else [tool.to_openai() for tool in trajectory.tools]
    messages, tools = template_inputs(messages, tools)
    assistants = tuple(i for i, message in enumerate(messages) if message["role"] == "assistant")
    trained = () if add_generation_prompt else _trained(len(assistants), train_turns, index)
    return Conversation(trajectory, messages, tools, assistants, trained)


def _trained(turns: int, train_turns: TrainTurns, index: int) -> tuple[int, ...]:
    if train_turns == "all":
        return tuple(range(turns))
    if train_turns == "last":
        return (turns - 1,)
    for turn in train_turns:
        if not -turns <= turn < turns:
            raise EncodeError(
                index,
                f"train_turns asks for assistant turn {turn}, but the conversation has "
                f"{turns} assistant turn(s) (valid: {-turns} to {turns - 1})",
            )
    return tuple(sorted({turn % turns for turn in train_turns}))
