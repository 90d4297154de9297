"""twinkle.env: tool schemas from signatures, ToolEnv's answers to good and bad calls, the
pool's per-trajectory failures, the sandbox's limits, and the bundled arithmetic task."""

from typing import Literal

import pytest

from twinkle.data_format import Message, ToolCall
from twinkle.env import (
    ArithmeticToolEnv,
    CodeSandboxEnv,
    Env,
    EnvFailure,
    EnvPool,
    StepResult,
    ToolEnv,
    answer_reward,
    arithmetic_tasks,
    calculator,
    run_python,
    tool_from_function,
)
from twinkle.env.sandbox import network_namespace_available


def lookup(city: str, units: Literal["c", "f"] = "c", days: list[int] | None = None) -> str:
    """Look up the weather.

    Args:
        city: the city's name.
        units: degrees Celsius or Fahrenheit.
    """
    return f"{city}: 20{units} for {days or [0]}"


def call(name: str, arguments) -> Message:
    return Message(
        role="assistant", content="", tool_calls=[ToolCall(name=name, arguments=arguments)]
    )


def test_tool_schema_comes_from_the_signature_and_docstring():
    tool = tool_from_function(lookup)
    assert tool.name == "lookup" and tool.description == "Look up the weather."
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "the city's name."},
            "units": {"enum": ["c", "f"], "description": "degrees Celsius or Fahrenheit."},
            "days": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["city"],
    }


def test_a_function_without_a_schema_is_refused_by_name():
    def untyped(x):
        return x

    def odd(x: object) -> str:
        return ""

    with pytest.raises(ValueError, match="argument 'x' has no type hint"):
        tool_from_function(untyped)
    with pytest.raises(ValueError, match="argument 'x'.*no JSON schema"):
        tool_from_function(odd)
    with pytest.raises(ValueError, match="not a lambda"):
        tool_from_function(lambda x: x)


def test_tool_env_runs_calls_and_answers_bad_ones_as_observations():
    env = ToolEnv([lookup], lambda answer, data: float(answer == data["city"]), system_prompt="S")
    first = env.reset(
        {"messages": [{"role": "user", "content": "hi"}], "user_data": [{"city": "Oslo"}]}
    )
    assert [m.role for m in first] == ["system", "user"] and env.user_data == {"city": "Oslo"}
    good = env.step(call("lookup", '{"city": "Oslo", "units": "f"}'))
    assert not good.done and good.reward == 0
    assert good.observation[0].role == "tool" and good.observation[0].content == "Oslo: 20f for [0]"
    for bad, expected in [
        (call("nope", {}), "no tool 'nope'"),
        (call("lookup", "{city: Oslo"), "not valid JSON"),
        (call("lookup", "[1]"), "must be a JSON object"),
        (call("lookup", {"town": "Oslo"}), "cannot take these arguments"),
    ]:
        result = env.step(bad)
        assert not result.done and expected in result.observation[0].content
        assert result.info["tool_errors"] == 1
    final = env.step(Message(role="assistant", content="Oslo"))
    assert final.done and final.reward == 1.0 and final.observation == []


def test_a_raising_tool_is_an_error_observation():
    def broken(x: int) -> str:
        raise RuntimeError("disk on fire")

    env = ToolEnv([broken], lambda a, d: 0.0)
    env.reset({"messages": [{"role": "user", "content": "go"}]})
    result = env.step(call("broken", {"x": 1}))
    assert result.observation[0].content == "error: RuntimeError: disk on fire"


class FlakyEnv(Env):
    """Fails at reset for task 'bad-reset' and at its second step for 'bad-step'."""

    def reset(self, task):
        if task["name"] == "bad-reset":
            raise KeyError("no such task")
        self.name, self.steps = task["name"], 0
        return [Message(role="user", content=self.name)]

    def step(self, assistant_message):
        self.steps += 1
        if self.name == "bad-step" and self.steps == 2:
            raise RuntimeError("backend down")
        return StepResult([Message(role="tool", content="ok")], reward=1.0, done=self.steps == 3)


@pytest.mark.parametrize("max_workers", [1, 4])
def test_pool_reports_a_failing_env_by_trajectory_and_turn_and_runs_the_rest(max_workers):
    pool = EnvPool(FlakyEnv, max_workers=max_workers)
    episodes = pool.reset([{"name": "a"}, {"name": "bad-reset"}, {"name": "bad-step"}])
    assert isinstance(episodes[1], EnvFailure) and episodes[1].turn == 0
    assert "trajectory 1" in str(episodes[1]) and "no such task" in str(episodes[1])
    turn = Message(role="assistant", content="x")
    first = pool.step({0: turn, 2: turn})
    assert all(isinstance(r, StepResult) for r in first.values())
    second = pool.step({0: turn, 2: turn})
    assert isinstance(second[0], StepResult)
    assert isinstance(second[2], EnvFailure) and (second[2].trajectory, second[2].turn) == (2, 2)
    assert "RuntimeError: backend down" in second[2].error
    assert pool.step({0: turn})[0].done
    with pytest.raises(ValueError, match="trajectory 7 has no episode"):
        pool.step({7: turn})


def test_pool_refuses_a_factory_that_does_not_build_an_env():
    with pytest.raises(TypeError, match="not an Env"):
        EnvPool(dict).reset([{}])


def test_sandbox_runs_a_program_and_reports_its_output():
    result = run_python("import math\nprint(math.factorial(10))")
    assert result.ok and result.stdout == "3628800\n" and result.report() == "3628800\n"
    failed = run_python("raise ValueError('bad input')")
    assert failed.returncode == 1 and failed.report() == "error: ValueError: bad input"


def test_sandbox_kills_a_program_past_its_time_limit():
    result = run_python("while True:\n    pass", timeout_s=1.0)
    assert result.limit == "time" and result.returncode is None
    assert "time limit" in result.report()


def test_sandbox_stops_a_program_past_its_memory_limit():
    result = run_python("x = bytearray(2 * 1024**3)\nprint('allocated')", memory_mb=128)
    assert result.limit == "memory" and "allocated" not in result.stdout
    assert "memory limit" in result.report()


@pytest.mark.parametrize(
    "program",
    [
        "import socket\nsocket.socket()",
        "import socket\nsocket.create_connection(('127.0.0.1', 9))",
        "import subprocess\nsubprocess.run(['ls'])",
        "import os\nos.system('ls')",
        "import ctypes",
    ],
)
def test_sandbox_refuses_network_processes_and_ctypes(program):
    result = run_python(program)
    assert result.returncode == 1 and "the sandbox does not allow" in result.stderr


def test_sandbox_has_only_the_standard_library_and_caps_output():
    assert "No module named 'numpy'" in run_python("import numpy").stderr
    flood = run_python("while True:\n    print('x' * 1000)", max_output_chars=100)
    assert flood.limit == "output" and len(flood.stdout) == 100


@pytest.mark.skipif(not network_namespace_available(), reason="no unprivileged user namespaces")
def test_sandbox_has_no_network_interface_but_loopback():
    result = run_python("print(open('/proc/net/dev').read())")
    rows = [line for line in result.stdout.splitlines()[2:] if line.strip()]
    interfaces = [line.split(":")[0].strip() for line in rows]
    assert interfaces == ["lo"]


def test_code_env_runs_the_models_program_and_reports_a_killed_one():
    env = CodeSandboxEnv(answer_reward, timeout_s=1.0)
    env.reset(
        {"messages": [{"role": "user", "content": "6 * 7 = ?"}], "user_data": [{"answer": "42"}]}
    )
    assert [t.name for t in env.tools] == ["run_python"]
    assert env.tools[0].parameters["required"] == ["code"]
    ran = env.step(call("run_python", {"code": "print(6 * 7)"}))
    assert ran.observation[0].content == "42\n"
    killed = env.step(call("run_python", {"code": "while True: pass"}))
    assert "time limit" in killed.observation[0].content and env.results[-1].limit == "time"
    assert env.step(Message(role="assistant", content="It is 42")).reward == 1.0


def test_calculator_evaluates_arithmetic_and_nothing_else():
    assert calculator("37 * 48") == "1776" and calculator("(1 + 2) * 3 - 4 / 8") == "8.5"
    for bad in ["__import__('os')", "2 ** 10", "x + 1", "1e13 * 2"]:
        with pytest.raises(ValueError):
            calculator(bad)


def test_arithmetic_task_splits_are_disjoint_and_the_env_scores_the_product():
    train, test = arithmetic_tasks("train"), arithmetic_tasks("test")
    assert len(train) + len(test) == 11 * 11 and len(test) == 24
    assert not {r["messages"][0]["content"] for r in train} & {
        r["messages"][0]["content"] for r in test
    }
    assert arithmetic_tasks("test") == test  # seeded
    env = ArithmeticToolEnv()
    env.reset(test[0])
    expression, answer = test[0]["user_data"][0]["expression"], test[0]["user_data"][0]["answer"]
    assert test[0]["messages"][0]["content"] == f"{expression} = ?"
    assert env.step(call("calculator", {"expression": expression})).observation[0].content == answer
    assert env.step(Message(role="assistant", content=answer)).reward == 1.0
    env.reset(test[0])
    assert env.step(Message(role="assistant", content="12")).reward == 0.0
    with pytest.raises(ValueError, match="split"):
        arithmetic_tasks("validation")


def test_tool_env_can_leave_the_schemas_out_of_the_prompt_and_still_run_calls():
    env = ArithmeticToolEnv(describe_tools=False)
    assert env.tools is None
    env.reset(arithmetic_tasks("test")[0])
    assert env.step(call("calculator", {"expression": "6 * 7"})).observation[0].content == "42"
