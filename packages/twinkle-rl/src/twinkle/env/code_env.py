"""CodeSandboxEnv: a ToolEnv whose one tool runs the model's Python in the sandbox."""

from __future__ import annotations

from typing import Any

from twinkle.env.sandbox import run_python
from twinkle.env.tool_env import RewardFn, ToolEnv


class CodeSandboxEnv(ToolEnv):
    """The model calls ``run_python(code)`` and reads what the program printed, or why it
    was stopped (``twinkle.env.sandbox``: a subprocess with ``timeout_s`` of wall time,
    ``memory_mb`` of address space, no network, the standard library only). A turn
    without a tool call is the final answer, scored by ``reward_fn(answer, user_data)``."""

    def __init__(
        self,
        reward_fn: RewardFn,
        *,
        timeout_s: float = 5.0,
        memory_mb: int = 256,
        max_output_chars: int = 2000,
        **tool_env_kwargs: Any,
    ) -> None:
        if timeout_s <= 0 or memory_mb <= 0 or max_output_chars <= 0:
            raise ValueError(
                f"timeout_s, memory_mb and max_output_chars must be positive, got {timeout_s}, "
                f"{memory_mb}, {max_output_chars}"
            )
        self.results: list[Any] = []

        def run_python_tool(code: str) -> str:
            """Run a Python program (standard library only, no network) and return what it
            printed.

            Args:
                code: the program's source; print what you want to read back.
            """
            result = run_python(
                code, timeout_s=timeout_s, memory_mb=memory_mb, max_output_chars=max_output_chars
            )
            self.results.append(result)
            return result.report()

        run_python_tool.__name__ = "run_python"
        super().__init__([run_python_tool], reward_fn, **tool_env_kwargs)
