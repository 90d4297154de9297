"""The RL loop through the unmodified Tinker SDK against a real twinkle-server.

sample (with logprobs) -> importance_sampling / ppo -> optim_step ->
save_weights_and_get_sampling_client, as tinker-cookbook's rl_loop does it; the sampler's
logprobs must match the trainer's for the same weights, before and after each sync.
Also: num_samples with sequence ids, stop token ids and ``stop=[]``, compute_logprobs,
and a sampling client made from a saved sampler checkpoint.
"""

from __future__ import annotations

import numpy as np
import pytest
from tinker import types

TIMEOUT_S = 120
PROMPT = [5, 17, 42, 9, 88, 3]
GROUP = 4
# Sampler and trainer run the same float32 model on CPU with different batching: their
# logprobs agree to ~1e-6; 1e-4 leaves room for the machine without hiding a wrong token.
LOGPROB_ATOL = 1e-4


@pytest.fixture(scope="module")
def training(service, base_model):
    return service.create_lora_training_client(base_model=base_model, rank=8).result(TIMEOUT_S)


def rl_datum(sequence: types.SampledSequence, advantage: float) -> types.Datum:
    """The cookbook's layout: inputs are prompt + completion minus the last token, targets
    the next tokens; sampler logprobs and advantages sit on the completion only."""
    tokens = PROMPT + list(sequence.tokens)
    prompt_targets = len(PROMPT) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.asarray(tokens[1:], dtype=np.int64),
            "logprobs": np.asarray([0.0] * prompt_targets + list(sequence.logprobs), np.float32),
            "advantages": np.asarray(
                [0.0] * prompt_targets + [advantage] * len(sequence.tokens), np.float32
            ),
        },
    )


def completion_logprobs(output: dict) -> np.ndarray:
    return output["logprobs"].to_numpy()[len(PROMPT) - 1 :]


def sample_group(sampler, seed: int) -> list[types.SampledSequence]:
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=seed)
    prompt = types.ModelInput.from_ints(PROMPT)
    return sampler.sample(prompt, num_samples=GROUP, sampling_params=params).result(TIMEOUT_S)


def test_rl_steps_keep_sampler_and_trainer_in_agreement(training):
    sampler = training.save_weights_and_get_sampling_client().result(TIMEOUT_S)
    group = sample_group(sampler, seed=1).sequences
    assert len(group) == GROUP
    assert len({seq.sequence_id for seq in group}) == GROUP
    for seq in group:
        assert 1 <= len(seq.tokens) <= 6 and len(seq.logprobs) == len(seq.tokens)
    advantages = [1.0, 1.0, -1.0, -1.0]  # the loop's mechanics, not a reward's
    data = [rl_datum(seq, a) for seq, a in zip(group, advantages, strict=True)]

    result = training.forward_backward(data, "importance_sampling").result(TIMEOUT_S)
    trainer = [completion_logprobs(o) for o in result.loss_fn_outputs]
    for seq, mine in zip(group, trainer, strict=True):  # on-policy: same weights
        np.testing.assert_allclose(mine, seq.logprobs, atol=LOGPROB_ATOL)
    ratio_sum = sum(
        a * np.exp(mine - np.asarray(seq.logprobs)).sum()
        for seq, mine, a in zip(group, trainer, advantages, strict=True)
    )
    assert result.metrics["loss:sum"] == pytest.approx(-ratio_sum, rel=1e-4, abs=1e-4)
    training.optim_step(types.AdamParams(learning_rate=2e-2)).result(TIMEOUT_S)

    synced = training.save_weights_and_get_sampling_client().result(TIMEOUT_S)
    after = training.forward(data, "importance_sampling").result(TIMEOUT_S)
    moved = 0.0
    for seq, out, before, a in zip(group, after.loss_fn_outputs, trainer, advantages, strict=True):
        full = PROMPT + list(seq.tokens)
        scored = synced.compute_logprobs(types.ModelInput.from_ints(full)).result(TIMEOUT_S)
        assert scored[0] is None and len(scored) == len(full)
        np.testing.assert_allclose(scored[1:], out["logprobs"].to_numpy(), atol=LOGPROB_ATOL)
        moved += a * (completion_logprobs(out) - before).sum()
    # One step on the importance-sampling surrogate raised the advantaged completions.
    assert moved > 0

    group2 = sample_group(synced, seed=2).sequences
    data2 = [rl_datum(seq, a) for seq, a in zip(group2, advantages, strict=True)]
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    ppo = training.forward_backward(data2, "ppo", config).result(TIMEOUT_S)
    for seq, out in zip(group2, ppo.loss_fn_outputs, strict=True):
        np.testing.assert_allclose(completion_logprobs(out), seq.logprobs, atol=LOGPROB_ATOL)
    assert np.isfinite(ppo.metrics["loss:sum"])
    training.optim_step(types.AdamParams(learning_rate=2e-2)).result(TIMEOUT_S)


def test_stop_token_ids_and_an_empty_stop_list(training):
    sampler = training.save_weights_and_get_sampling_client().result(TIMEOUT_S)
    prompt = types.ModelInput.from_ints(PROMPT)

    def one(**params) -> types.SampledSequence:
        params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7, **params)
        future = sampler.sample(prompt, num_samples=1, sampling_params=params)
        return future.result(TIMEOUT_S).sequences[0]

    free = one()
    stop_at = free.tokens[1]
    stopped = one(stop=[stop_at])
    assert list(stopped.tokens) == list(free.tokens[: list(free.tokens).index(stop_at) + 1])
    assert stopped.stop_reason == "stop"
    unbounded = one(stop=[])
    assert len(unbounded.tokens) == 6 and unbounded.stop_reason == "length"


def test_a_sampler_checkpoint_serves_a_new_sampling_client(service, training):
    path = training.save_weights_for_sampler("rl-final").result(TIMEOUT_S).path
    assert path.startswith("tinker://") and path.endswith("/sampler_weights/rl-final")
    from_path = service.create_sampling_client(model_path=path).result(TIMEOUT_S)
    ephemeral = training.save_weights_and_get_sampling_client().result(TIMEOUT_S)
    prompt = types.ModelInput.from_ints(PROMPT)
    saved = from_path.compute_logprobs(prompt).result(TIMEOUT_S)
    live = ephemeral.compute_logprobs(prompt).result(TIMEOUT_S)
    assert saved[0] is None and live[0] is None
    np.testing.assert_allclose(saved[1:], live[1:], atol=1e-6)  # the same weights, one sampler
