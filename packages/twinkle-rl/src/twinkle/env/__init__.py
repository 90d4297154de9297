"""Environments for multi-turn RL: what the model's turns act on.

``Env`` (``reset(task)`` -> first observation messages; ``step(assistant_message)`` ->
``StepResult(observation, reward, done, info)``), ``EnvPool`` (one env per trajectory,
stepped together; an env that raises is an ``EnvFailure`` naming the trajectory and the
turn), ``ToolEnv`` (Python functions as tools, their schemas from their signatures),
``CodeSandboxEnv`` and ``run_python`` (a subprocess with time and memory limits and no
network), and the bundled task ``ArithmeticToolEnv`` with ``arithmetic_tasks``.
"""

from twinkle.env.arithmetic import (
    ArithmeticToolEnv,
    answer_reward,
    arithmetic_tasks,
    calculator,
    task_row,
)
from twinkle.env.base import Env, StepResult
from twinkle.env.code_env import CodeSandboxEnv
from twinkle.env.pool import EnvFailure, EnvPool, Episode
from twinkle.env.sandbox import SandboxResult, run_python
from twinkle.env.schema import tool_from_function
from twinkle.env.tool_env import ToolEnv

__all__ = [
    "ArithmeticToolEnv",
    "CodeSandboxEnv",
    "Env",
    "EnvFailure",
    "EnvPool",
    "Episode",
    "SandboxResult",
    "StepResult",
    "ToolEnv",
    "answer_reward",
    "arithmetic_tasks",
    "calculator",
    "task_row",
    "run_python",
    "tool_from_function",
]
