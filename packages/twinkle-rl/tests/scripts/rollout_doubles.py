"""Test doubles for rollouts: a sampler that replays scripted turns as token ids, so a test
knows every token the rollout must hold."""

from __future__ import annotations

import numpy as np

from twinkle.data_format import SampledSequence, SampleResponse


class ScriptedSampler:
    """Returns, for the n-th prompt of a call, the next scripted turn of trajectory n:
    ``script[n]`` is a list of turns, each a list of token ids (ending in the end-of-turn
    token to close the turn). Logprobs are -0.5 - 0.01 * position, distinct per token."""

    def __init__(self, tokenizer, script: list[list[list[int]]], stop_ids: set[int]) -> None:
        self.tokenizer, self.script, self.stop_ids = tokenizer, script, stop_ids
        self.turn = [0] * len(script)
        self.prompts: list[list[list[int]]] = []

    def sample(self, prompts, params, adapter_name=None):
        self.prompts.append([np.asarray(p.input_ids).tolist() for p in prompts])
        live = [i for i, _ in enumerate(self.script) if self.turn[i] < len(self.script[i])]
        responses = []
        for index, _prompt in zip(live, prompts, strict=False):
            tokens = self.script[index][self.turn[index]][: params.max_tokens]
            self.turn[index] += 1
            stopped = bool(tokens) and tokens[-1] in self.stop_ids
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            logprobs = [[(t, -0.5 - 0.01 * k)] for k, t in enumerate(tokens)]
            responses.append(
                SampleResponse(
                    sequences=[
                        SampledSequence(
                            tokens=tokens,
                            logprobs=logprobs,
                            stop_reason="stop" if stopped else "length",
                            text=text,
                        )
                    ]
                )
            )
        return responses
