"""ToolEnv: Python functions as the tools of a multi-turn episode.

Each assistant turn that calls tools gets one ``tool`` message per call with the function's
result (``str()`` of it); a turn without tool calls is the final answer, which ends the
episode and is scored by ``reward_fn(answer_text, task)``. A call the function cannot take
(an unknown name, arguments that are not a JSON object, arguments that do not fit the
signature, a function that raises) is answered with an ``error: ...`` tool message the
model reads, as agents expect: the model's mistake is an observation, not a crash.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from twinkle.data_format import Message, ToolCall, Trajectory
from twinkle.env.base import Env, StepResult
from twinkle.env.schema import tool_from_function

RewardFn = Callable[[str, Mapping[str, Any]], float]


class ToolEnv(Env):
    """An episode over ``task`` rows shaped like a Trajectory (``messages``, optional
    ``user_data``): ``reset`` gives the task's messages (after ``system_prompt`` when given),
    ``step`` runs the tool calls. ``max_tool_calls`` bounds the calls of one turn.
    ``describe_tools=False`` leaves the schemas out of the prompt (``tools`` is None) while
    the calls still run: a model trained to call them needs no schema, and a tiny model
    trains faster on the shorter prompt."""

    def __init__(
        self,
        functions: Sequence[Callable[..., Any]],
        reward_fn: RewardFn,
        *,
        system_prompt: str | None = None,
        max_tool_calls: int = 4,
        describe_tools: bool = True,
    ) -> None:
        super().__init__()
        if not functions:
            raise ValueError("ToolEnv needs at least one function to offer as a tool")
        if max_tool_calls < 1:
            raise ValueError(f"max_tool_calls must be >= 1, got {max_tool_calls}")
        self.functions = {f.__name__: f for f in functions}
        schemas = [tool_from_function(f) for f in functions]  # checked even when not shown
        self.tools = schemas if describe_tools else None
        self.reward_fn = reward_fn
        self.system_prompt = system_prompt
        self.max_tool_calls = max_tool_calls
        self.task: Mapping[str, Any] = {}

    def reset(self, task: Mapping[str, Any]) -> list[Message]:
        trajectory = Trajectory.model_validate(
            {"messages": task.get("messages"), "user_data": task.get("user_data", [])}
        )
        self.task = task
        self.user_data = dict(trajectory.user_data[0]) if trajectory.user_data else {}
        system = [Message(role="system", content=self.system_prompt)] if self.system_prompt else []
        return [*system, *trajectory.messages]

    def step(self, assistant_message: Message) -> StepResult:
        calls = assistant_message.tool_calls or []
        if not calls:
            text = assistant_message.content if isinstance(assistant_message.content, str) else ""
            reward = float(self.reward_fn(text, self.user_data))
            return StepResult([], reward=reward, done=True)
        if len(calls) > self.max_tool_calls:
            note = f"error: at most {self.max_tool_calls} tool calls per turn, got {len(calls)}"
            return StepResult([Message(role="tool", content=note)], info={"tool_errors": 1})
        replies = [self._call(call) for call in calls]
        errors = sum(reply.content.startswith("error:") for reply in replies)
        return StepResult(replies, info={"tool_calls": len(calls), "tool_errors": errors})

    def _call(self, call: ToolCall) -> Message:
        def reply(content: str) -> Message:
            return Message(role="tool", content=content, name=call.name, tool_call_id=call.id)

        function = self.functions.get(call.name)
        if function is None:
            return reply(f"error: no tool {call.name!r}; the tools are {sorted(self.functions)}")
        arguments = call.arguments
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as err:
                return reply(f"error: the arguments are not valid JSON ({err.msg})")
        if not isinstance(arguments, dict):
            return reply("error: the arguments must be a JSON object")
        try:
            inspect.signature(function).bind(**arguments)
        except TypeError as err:
            return reply(f"error: {call.name} cannot take these arguments ({err})")
        try:
            return reply(str(function(**arguments)))
        except Exception as err:  # noqa: BLE001 - the tool's failure is the model's observation
            return reply(f"error: {type(err).__name__}: {err}")
