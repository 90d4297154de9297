"""MultiTurnRollout: sample, parse the tool calls, step the env, append, sample again.

Token in, token out. Each trajectory's sequence starts as the template's encoding of the
env's first observation (with the env's tools, and the generation prompt); then, per turn,
the sampler continues that exact token list, its tokens are appended as sampled (with
their logprobs, ``loss_mask`` 1), the turn's text is parsed for tool calls with the
family's parser, the env steps on the parsed message, and the template's rendering of the
observation is tokenized and appended (``loss_mask`` 0). Nothing already in the sequence is
ever re-tokenised, so the trainer scores exactly the tokens the sampler produced.

A turn whose tool call does not parse is answered, without stepping the env, by a ``tool``
message saying so (the model sees its mistake, as agents expect). An env that raises ends
only its own trajectory (``stop_reason='env_error'``, ``error`` naming the trajectory and
turn). Limits: ``max_turns`` assistant turns, ``max_tokens`` tokens in a whole sequence
(prompt included), ``sampling_params.max_tokens`` per turn.

All live trajectories are sampled in one ``sampler.sample`` call per turn, so this works with
any Sampler (TorchSampler, vLLMSampler), a Ray sampler component, or the Twinkle client's
remote sampler; the env pool may be a Ray component on its own group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from twinkle.data_format import InputFeature, Message, SampleResponse, SamplingParams
from twinkle.env import Env, EnvFailure, EnvPool, Episode, StepResult
from twinkle.rollout.observation import observation_tokens
from twinkle.rollout.trajectory import RolloutTrajectory

ResponseParser = Callable[[str], Mapping[str, Any] | Message]
"""Text of an assistant turn -> the assistant message it is (content, reasoning_content,
tool_calls), as ``Template.parse_response`` gives it; raises ValueError (the template's
``ToolCallError``) naming what is malformed."""


class MultiTurnRollout:
    """Runs episodes of ``env`` (an EnvPool, or an Env class or factory to build one) with
    ``sampler`` and ``template`` (the one the model trains with). ``response_parser`` turns a
    turn's text into the assistant message; by default ``template.parse_response``, the
    model family's tool-call format. ``sample_kwargs`` go to every ``sampler.sample`` call
    (``adapter_name=`` for a local sampler, ``adapter_uri=`` for the client's)."""

    def __init__(
        self,
        sampler: Any,
        template: Any,
        env: EnvPool | Callable[..., Env],
        max_turns: int,
        *,
        sampling_params: SamplingParams | Mapping[str, Any],
        max_tokens: int = 2048,
        response_parser: ResponseParser | None = None,
        sample_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
        if isinstance(sampling_params, Mapping) and not isinstance(sampling_params, SamplingParams):
            sampling_params = SamplingParams(**sampling_params)
        if sampling_params.num_samples != 1:
            raise ValueError(
                "sampling_params.num_samples must be 1: ask rollout(tasks, num_samples=G) for "
                "G trajectories per task (each has an env of its own)"
            )
        self.sampler = sampler
        self.template = template
        self.env_pool = _env_pool(env)
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.sampling_params = sampling_params
        self.response_parser = response_parser or _family_parser(template)
        self.sample_kwargs = dict(sample_kwargs or {})

    def __call__(
        self, tasks: Sequence[Mapping[str, Any]], num_samples: int = 1
    ) -> list[RolloutTrajectory]:
        """``num_samples`` trajectories per task, task by task (trajectory ``i`` ran task
        ``i // num_samples``), each finished with a ``stop_reason``."""
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        tasks = list(tasks)
        if not tasks:
            raise ValueError("rollout got no tasks")
        runs = [task for task in tasks for _ in range(num_samples)]
        trajectories = [
            self._start(i, i // num_samples, i % num_samples, episode)
            for i, episode in enumerate(self.env_pool.reset(runs))
        ]
        for turn in range(self.max_turns):
            live = [t for t in trajectories if not t.done]
            if not live:
                break
            self._sample_turn(live, turn)
            self._step_envs([t for t in live if not t.done], turn)
        for trajectory in trajectories:
            if not trajectory.done:
                trajectory.stop_reason = "max_turns"
        return trajectories

    # ---- one turn -------------------------------------------------------------------------

    def _start(
        self, index: int, task: int, sample: int, episode: Episode | EnvFailure
    ) -> RolloutTrajectory:
        if isinstance(episode, EnvFailure):
            return RolloutTrajectory(
                index, task, sample, [], [], [], 0, [], stop_reason="env_error", error=str(episode)
            )
        prompt = self.template.encode(
            {"messages": episode.observation, "tools": episode.tools}, add_generation_prompt=True
        )
        # A template with truncation_strategy='delete' drops a prompt over its max_length.
        ids = [] if prompt is None else np.asarray(prompt.input_ids).reshape(-1).tolist()
        trajectory = RolloutTrajectory(
            index,
            task,
            sample,
            tokens=list(ids),
            loss_mask=[0] * len(ids),
            logprobs=[0.0] * len(ids),
            prompt_length=len(ids),
            messages=list(episode.observation),
            tools=episode.tools,
            user_data=episode.user_data,
        )
        if prompt is None or len(ids) >= self.max_tokens:
            trajectory.stop_reason = "max_tokens"
        return trajectory

    def _sample_turn(self, live: list[RolloutTrajectory], turn: int) -> None:
        """One sampler call per distinct token budget (most trajectories share the turn's)."""
        budgets: dict[int, list[RolloutTrajectory]] = {}
        for trajectory in live:
            room = self.max_tokens - len(trajectory.tokens)
            budgets.setdefault(min(self.sampling_params.max_tokens, room), []).append(trajectory)
        for call, (budget, group) in enumerate(sorted(budgets.items())):
            params = self._turn_params(budget, turn, call)
            prompts = [InputFeature(input_ids=np.asarray(t.tokens, dtype=np.int64)) for t in group]
            responses = _responses(self.sampler.sample(prompts, params, **self.sample_kwargs))
            for trajectory, response in zip(group, responses, strict=True):
                self._take_sample(trajectory, _first_sequence(response))

    def _turn_params(self, budget: int, turn: int, call: int) -> SamplingParams:
        changes: dict[str, Any] = {"max_tokens": budget}
        if self.sampling_params.seed is not None:  # a seed of its own per turn and call
            words = np.random.SeedSequence([self.sampling_params.seed, turn, call])
            changes["seed"] = int(words.generate_state(1, np.uint64)[0] >> np.uint64(2))
        return SamplingParams(**{**self.sampling_params.to_dict(), **changes})

    def _take_sample(self, trajectory: RolloutTrajectory, sequence: Any) -> None:
        tokens = list(sequence.tokens)
        logprobs = [float(pairs[0][1]) for pairs in sequence.logprobs or []]
        if len(logprobs) != len(tokens):
            raise ValueError(
                f"the sampler returned {len(logprobs)} logprobs for {len(tokens)} tokens; "
                "MultiTurnRollout needs one logprob per sampled token"
            )
        trajectory.extend(tokens, sampled=True, logprobs=logprobs)
        trajectory.turns += 1
        text = sequence.text if sequence.text is not None else ""
        trajectory.messages.append(Message(role="assistant", content=text))
        if sequence.stop_reason == "abort":
            trajectory.stop_reason = "abort"
        elif sequence.stop_reason == "length":
            full = len(trajectory.tokens) >= self.max_tokens
            trajectory.stop_reason = "max_tokens" if full else "length"

    def _step_envs(self, live: list[RolloutTrajectory], turn: int) -> None:
        actions: dict[int, Message] = {}
        observations: dict[int, list[Message]] = {}
        for trajectory in live:
            reply = trajectory.messages[-1]
            try:
                message = _assistant_message(self.response_parser(reply.content))
            except ValueError as err:
                trajectory.infos.append({"turn": turn, "parse_error": str(err)})
                observations[trajectory.id] = [
                    Message(role="tool", content=f"error: the tool call does not parse: {err}")
                ]
                continue
            trajectory.messages[-1] = message
            actions[trajectory.id] = message
        outcomes = self.env_pool.step(actions) if actions else {}
        by_id = {t.id: t for t in live}
        for index, outcome in outcomes.items():
            trajectory = by_id[index]
            if isinstance(outcome, EnvFailure):
                trajectory.stop_reason, trajectory.error = "env_error", str(outcome)
                continue
            _record(trajectory, outcome, turn)
            if outcome.done:
                trajectory.stop_reason = "done"
            else:
                observations[index] = outcome.observation
        self._append_observations([(by_id[i], o) for i, o in observations.items()], turn)

    def _append_observations(
        self, pending: list[tuple[RolloutTrajectory, list[Message]]], turn: int
    ) -> None:
        if turn + 1 >= self.max_turns:
            for trajectory, _ in pending:
                trajectory.stop_reason = "max_turns"  # no turn left to read it
            return
        ends = [self.template.decode(t.tokens[-1:]) if t.tokens else "" for t, _ in pending]
        token_lists = observation_tokens(
            self.template, [(o, t.tools, end) for (t, o), end in zip(pending, ends, strict=True)]
        )
        for (trajectory, observation), tokens in zip(pending, token_lists, strict=True):
            if len(trajectory.tokens) + len(tokens) >= self.max_tokens:
                trajectory.stop_reason = "max_tokens"
                continue
            trajectory.extend(tokens, sampled=False)
            trajectory.messages += observation


def _record(trajectory: RolloutTrajectory, outcome: StepResult, turn: int) -> None:
    trajectory.reward += float(outcome.reward)
    if outcome.info:
        trajectory.infos.append({"turn": turn, **outcome.info})


def _responses(result: Any) -> list[Any]:
    """One response per prompt: a sampler's list, or the Twinkle client's ``'responses'``."""
    if isinstance(result, Mapping) and "responses" in result:
        return list(result["responses"])
    return list(result)


def _first_sequence(response: Any) -> Any:
    """The one sequence of a SampleResponse (or of the dict a remote sampler returns)."""
    if isinstance(response, Mapping):
        response = SampleResponse.model_validate(dict(response))
    return response.sequences[0]


def _env_pool(env: Any) -> Any:
    """``env`` as a pool: an EnvPool (in process, or a Ray component's proxy) as it is, an Env
    class or factory wrapped in one."""
    if isinstance(env, Env):
        raise TypeError(
            "MultiTurnRollout needs one env per trajectory: pass the Env class or a function "
            "that builds one (or an EnvPool), not an Env instance"
        )
    if isinstance(env, type) or not all(hasattr(env, m) for m in ("reset", "step", "close")):
        return EnvPool(env)
    return env


def _family_parser(template: Any) -> ResponseParser:
    parse = getattr(template, "parse_response", None)
    if parse is None:
        raise ValueError(
            f"{type(template).__name__} has no parse_response; pass "
            "MultiTurnRollout(..., response_parser=...) that turns a turn's text into the "
            "assistant message (content, tool_calls)"
        )
    return parse


def _assistant_message(parsed: Mapping[str, Any] | Message) -> Message:
    message = parsed if isinstance(parsed, Message) else Message.model_validate(dict(parsed))
    if message.role != "assistant":
        raise ValueError(f"the response parser gave a {message.role!r} message, not 'assistant'")
    if not message.tool_calls:
        message.tool_calls = None
    return message
