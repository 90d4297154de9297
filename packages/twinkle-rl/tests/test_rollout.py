"""MultiTurnRollout: the sequence is exactly the sampled tokens plus the template's rendering
of each observation, with per-token masks and logprobs; limits, failures and the real
TorchSampler's own logprobs of the sequence."""

import functools
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from rollout_doubles import ScriptedSampler  # noqa: E402

from twinkle.data_format import Message, SamplingParams, ToolCall  # noqa: E402
from twinkle.env import (  # noqa: E402
    ArithmeticToolEnv,
    CodeSandboxEnv,
    Env,
    StepResult,
    answer_reward,
    arithmetic_tasks,
    task_row,
)
from twinkle.rollout import MultiTurnRollout  # noqa: E402
from twinkle.template import Qwen3_5Template  # noqa: E402

MODEL_ID = "bundled://tiny-qwen3"
PARAMS = SamplingParams(max_tokens=64, temperature=1.0)


@pytest.fixture(scope="module")
def template():
    return Qwen3_5Template(MODEL_ID)


def im_end(template):
    return template.tokenizer.convert_tokens_to_ids("<|im_end|>")


def ids(template, text):
    return template.tokenizer(text, add_special_tokens=False)["input_ids"]


def solved_conversation(task):
    data = task["user_data"][0]
    call = ToolCall(name="calculator", arguments={"expression": data["expression"]})
    return [
        *task["messages"],
        {"role": "assistant", "content": "", "tool_calls": [call.to_openai()]},
        {"role": "tool", "content": data["answer"]},
        {"role": "assistant", "content": data["answer"]},
    ]


def assistant_texts(template, messages):
    """The text each assistant turn writes, cut from the template's own rendering."""
    text = template.render({"messages": messages, "tools": ArithmeticToolEnv().tools})
    header, end = "<|im_start|>assistant\n", "<|im_end|>"
    parts, at = [], text.find(header)
    while at >= 0:
        start = at + len(header)
        parts.append(text[start : text.index(end, start)])
        at = text.find(header, start)
    return parts


def rollout_of(template, script, env=ArithmeticToolEnv, **kwargs):
    sampler = ScriptedSampler(template.tokenizer, script, {im_end(template)})
    kwargs.setdefault("max_turns", 4)
    rollout = MultiTurnRollout(sampler, template, env, sampling_params=PARAMS, **kwargs)
    return rollout, sampler


def test_sequence_is_the_sampled_tokens_plus_the_templates_observations(template):
    task = arithmetic_tasks("test")[0]
    answer = task["user_data"][0]["answer"]
    conversation = solved_conversation(task)
    call_text, answer_text = assistant_texts(template, conversation)
    eot = im_end(template)
    solving = [ids(template, call_text) + [eot], ids(template, answer_text) + [eot]]
    # A wrong direct answer, sampled digit by digit: not the tokenizer's own split of it.
    digits = [t for d in "1234" for t in ids(template, d)]
    guessing = [digits + [eot]]
    rollout, sampler = rollout_of(template, [solving, guessing])
    solved, guessed = rollout([task, task])

    # With the tokenizer's own split of each turn, the incremental sequence is the template's
    # encoding of the whole conversation (which ends with one newline more).
    encoded = template.encode({"messages": conversation, "tools": solved.tools}).input_ids.tolist()
    assert solved.tokens == encoded[:-1]
    assert (solved.stop_reason, solved.reward, solved.turns) == ("done", 1.0, 2)
    assert (
        solved.messages[-1].content == answer
        and solved.messages[1].tool_calls[0].name == "calculator"
    )
    # The second turn was sampled from exactly the sequence so far.
    second_prompt = sampler.prompts[1][0]
    assert solved.tokens[: len(second_prompt)] == second_prompt
    assert second_prompt[-3:] == ids(template, "<|im_start|>assistant\n")
    # Masks and logprobs: exactly the sampled tokens, in order, with their logprobs.
    mask = np.asarray(solved.loss_mask, dtype=bool)
    assert np.asarray(solved.tokens)[mask].tolist() == solving[0] + solving[1]
    expected = [-0.5 - 0.01 * k for turn in solving for k in range(len(turn))]
    assert solved.sampled_logprobs() == pytest.approx(expected)
    assert not any(np.asarray(solved.logprobs)[~mask])
    feature = solved.input_feature()
    expected_labels = np.where(mask, solved.tokens, -100)
    assert feature.labels.tolist() == expected_labels.tolist()
    assert len(solved.sampled_logprobs()) == int((feature.labels != -100).sum())
    assert feature.user_data == [task["user_data"][0]]

    # The digit-by-digit answer stays as sampled: nothing is re-tokenised.
    assert guessed.tokens[guessed.prompt_length :] == guessing[0]
    assert ids(template, "1234") != digits
    assert (guessed.stop_reason, guessed.reward, guessed.turns) == ("done", 0.0, 1)


def test_an_unparsable_tool_call_is_an_observation_the_model_reads(template):
    eot = im_end(template)
    script = [
        [
            ids(template, '<tool_call>\n{"name": calculator\n</tool_call>') + [eot],
            ids(template, "12") + [eot],
        ]
    ]
    rollout, sampler = rollout_of(template, script)
    (trajectory,) = rollout([task_row(3, 4)])
    assert trajectory.stop_reason == "done" and trajectory.turns == 2
    assert "not valid JSON" in trajectory.infos[0]["parse_error"]
    observation = trajectory.messages[2]
    assert observation.role == "tool" and "does not parse" in observation.content
    shown = template.decode(sampler.prompts[1][0])
    assert "error: the tool call does not parse" in shown


def test_a_sandboxed_program_past_its_limits_is_killed_and_the_model_reads_why(template):
    """End to end: the model's programs run in CodeSandboxEnv's sandbox; one that loops past
    its time limit and one that allocates past its memory limit are stopped, the trajectory
    goes on, and the next prompt carries the report."""
    eot = im_end(template)

    def run(code):
        call = {"name": "run_python", "arguments": {"code": code}}
        return ids(template, f"<tool_call>\n{json.dumps(call)}\n</tool_call>") + [eot]

    big = "bytearray(2**31)"
    script = [[run("while True: pass"), run(big), run("print(3 * 4)"), ids(template, "12") + [eot]]]
    env = functools.partial(CodeSandboxEnv, answer_reward, timeout_s=1.0, memory_mb=128)
    rollout, sampler = rollout_of(template, script, env=env)
    (trajectory,) = rollout([task_row(3, 4)])
    assert (trajectory.stop_reason, trajectory.turns, trajectory.reward) == ("done", 4, 1.0)
    observations = [m.content for m in trajectory.messages if m.role == "tool"]
    assert "time limit" in observations[0] and "memory limit" in observations[1]
    assert observations[2] == "12\n"
    assert "time limit" in template.decode(sampler.prompts[1][0])
    assert "memory limit" in template.decode(sampler.prompts[2][0])


class BreaksOnSecondStep(Env):
    def reset(self, task):
        self.steps = 0
        return [Message(role="user", content=task["messages"][0]["content"])]

    def step(self, assistant_message):
        self.steps += 1
        if self.steps == 2 and assistant_message.content == "boom":
            raise RuntimeError("the env's backend is down")
        return StepResult([Message(role="user", content="go on")], done=self.steps == 3)


def test_an_env_that_raises_ends_only_its_trajectory(template):
    eot = im_end(template)
    turn = ids(template, "ok") + [eot]
    boom = ids(template, "boom") + [eot]
    rollout, _ = rollout_of(template, [[turn, boom], [turn, turn, turn]], env=BreaksOnSecondStep)
    broken, fine = rollout([task_row(1, 2), task_row(1, 2)])
    assert broken.stop_reason == "env_error"
    assert "trajectory 0" in broken.error and "turn 2" in broken.error
    assert "backend is down" in broken.error
    assert (fine.stop_reason, fine.turns) == ("done", 3)


def test_turn_and_token_limits(template):
    eot = im_end(template)
    turn = ids(template, "ok") + [eot]
    rollout, _ = rollout_of(template, [[turn] * 5], env=BreaksOnSecondStep, max_turns=2)
    (capped,) = rollout([task_row(1, 2)])
    assert (capped.stop_reason, capped.turns) == ("max_turns", 2)
    assert capped.tokens[-1] == eot  # no observation is appended that no turn would read

    long_turn = ids(template, "word " * 40)
    rollout, _ = rollout_of(template, [[long_turn]], env=BreaksOnSecondStep, max_tokens=40)
    (full,) = rollout([task_row(1, 2)])
    assert full.stop_reason == "max_tokens" and len(full.tokens) == 40

    rollout, _ = rollout_of(template, [[long_turn]], env=BreaksOnSecondStep, max_tokens=5)
    (no_room,) = rollout([task_row(1, 2)])  # the prompt alone is over the limit
    assert no_room.stop_reason == "max_tokens" and no_room.num_sampled_tokens == 0
    dropping = Qwen3_5Template(MODEL_ID, max_length=5, truncation_strategy="delete")
    rollout, _ = rollout_of(dropping, [[long_turn]], env=BreaksOnSecondStep)
    (dropped,) = rollout([task_row(1, 2)])  # the template dropped the long prompt
    assert dropped.stop_reason == "max_tokens" and dropped.tokens == []

    rollout, _ = rollout_of(template, [[long_turn]], env=BreaksOnSecondStep)
    rollout.sampling_params = SamplingParams(max_tokens=8)
    (cut,) = rollout([task_row(1, 2)])
    assert cut.stop_reason == "length" and cut.num_sampled_tokens == 8


def test_num_samples_gives_each_task_a_group(template):
    eot = im_end(template)
    script = [[ids(template, str(n)) + [eot]] for n in range(6)]
    rollout, _ = rollout_of(template, script)
    trajectories = rollout([task_row(1, 2), task_row(3, 4)], num_samples=3)
    assert [(t.id, t.task_index, t.sample_index) for t in trajectories] == [
        (i, i // 3, i % 3) for i in range(6)
    ]
    assert [t.user_data["answer"] for t in trajectories] == ["2"] * 3 + ["12"] * 3


def test_bad_arguments_are_refused_with_the_fix(template):
    sampler = ScriptedSampler(template.tokenizer, [], set())
    with pytest.raises(TypeError, match="not an Env instance"):
        MultiTurnRollout(sampler, template, ArithmeticToolEnv(), 2, sampling_params=PARAMS)
    two = SamplingParams(max_tokens=4, num_samples=2)
    with pytest.raises(ValueError, match="num_samples=G"):
        MultiTurnRollout(sampler, template, ArithmeticToolEnv, 2, sampling_params=two)
    with pytest.raises(ValueError, match="max_turns"):
        MultiTurnRollout(sampler, template, ArithmeticToolEnv, 0, sampling_params=PARAMS)
    with pytest.raises(ValueError, match="no parse_response"):
        MultiTurnRollout(sampler, object(), ArithmeticToolEnv, 2, sampling_params=PARAMS)


def calls_calculator(text):
    """Every turn of the random model calls the calculator, so the episode goes on."""
    call = ToolCall(name="calculator", arguments={"expression": "1 + 1"})
    return {"role": "assistant", "content": text, "tool_calls": [call.to_openai()]}


def test_torch_sampler_trajectory_scores_as_sampled(sampler):
    """The trainer sees the sampler's tokens: the model's own logprobs of the whole sequence,
    at the sampled positions, are the sampler's logprobs."""
    template = sampler.template
    # Every even id ends a turn, so the random model's turns end after a few tokens, and
    # mostly not with <|im_end|>: the template's rendering then closes the turn itself.
    stop = list(range(0, len(template.tokenizer), 2))
    rollout = MultiTurnRollout(
        sampler,
        template,
        ArithmeticToolEnv,
        max_turns=3,
        sampling_params=SamplingParams(max_tokens=8, temperature=1.0, seed=7, stop=stop),
        response_parser=calls_calculator,
    )
    trajectories = rollout([task_row(12, 34), task_row(56, 78)], num_samples=2)
    assert all(t.turns == 3 and t.stop_reason == "max_turns" for t in trajectories)
    for trajectory in trajectories:
        assert trajectory.messages[2].content == "2"  # the calculator's answer was observed
        tokens = torch.tensor([trajectory.tokens])
        with torch.no_grad():
            logits = sampler.model(input_ids=tokens).logits.float()
        scored = torch.log_softmax(logits[0, :-1], -1).gather(1, tokens[0, 1:, None])[:, 0]
        mask = torch.tensor(trajectory.loss_mask[1:], dtype=torch.bool)
        sampled = torch.tensor(trajectory.sampled_logprobs())
        assert torch.allclose(scored[mask], sampled, atol=1e-4)
    again = rollout([task_row(12, 34), task_row(56, 78)], num_samples=2)
    assert [t.tokens for t in again] == [t.tokens for t in trajectories]  # seeded
