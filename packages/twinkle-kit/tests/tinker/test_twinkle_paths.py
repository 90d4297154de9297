"""After init_tinker_client(), every SDK call that takes a checkpoint path takes its twinkle://
form, and means the same checkpoint as the tinker:// path the SDK was given at save time.

The unmodified SDK (the version installed here) refuses ``twinkle://`` on the client; the
tests show the wrapped calls reach the same checkpoint (same sampled tokens, same logprobs,
same run), that another key's twinkle:// path is refused as its tinker:// path is, and
that a process which never calls init_tinker_client gets the SDK untouched. The documents'
TaaS sampling example (cookbook/tinker/sample.py) runs as a script against the server.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tinker
from tinker import types

import twinkle

TIMEOUT_S = 120
TOKENS = [3, 14, 15, 92, 65, 35, 89, 79]
SAMPLE = Path(__file__).resolve().parents[4] / "cookbook" / "tinker" / "sample.py"


def _datum(tokens: list[int]) -> types.Datum:
    n = len(tokens) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=tokens[1:], dtype="int64", shape=[n]),
            "weights": types.TensorData(data=[1.0] * n, dtype="float32", shape=[n]),
        },
    )


def _twinkle(path: str) -> str:
    assert path.startswith("tinker://"), path
    return "twinkle://" + path[len("tinker://") :]


def _logprobs(training: tinker.TrainingClient) -> np.ndarray:
    out = training.forward([_datum(TOKENS)], "cross_entropy").result(TIMEOUT_S)
    return np.asarray(out.loss_fn_outputs[0]["logprobs"].tolist(), dtype=np.float64)


def _tokens(sampling: tinker.SamplingClient) -> list[list[int]]:
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=11, stop=[])
    prompt = types.ModelInput.from_ints(TOKENS[:4])
    result = sampling.sample(prompt, num_samples=2, sampling_params=params).result(TIMEOUT_S)
    return [list(sequence.tokens) for sequence in result.sequences]


@pytest.fixture(scope="module")
def saved(tinker_server, base_model):
    """Key A's trained run with a training checkpoint and a sampler checkpoint."""
    twinkle.init_tinker_client()
    url = tinker_server.base_url
    service = tinker.ServiceClient(base_url=url, api_key=tinker_server.key_a)
    training = service.create_lora_training_client(base_model=base_model, rank=4).result(TIMEOUT_S)
    training.forward_backward([_datum(TOKENS)], "cross_entropy").result(TIMEOUT_S)
    training.optim_step(types.AdamParams(learning_rate=5e-2)).result(TIMEOUT_S)
    yield {
        "service": service,
        "rest": tinker.RestClient(base_url=url, api_key=tinker_server.key_a),
        "training": training,
        "state": training.save_state("tw-state").result(TIMEOUT_S).path,
        "sampler": training.save_weights_for_sampler("tw-sampler").result(TIMEOUT_S).path,
    }
    service.close("success").result(TIMEOUT_S)


def test_a_sampling_client_from_a_twinkle_path_samples_that_checkpoint(saved):
    service = saved["service"]
    for path in (saved["state"], saved["sampler"]):
        by_tinker = service.create_sampling_client(model_path=path).result(TIMEOUT_S)
        by_twinkle = service.create_sampling_client(model_path=_twinkle(path)).result(TIMEOUT_S)
        assert _tokens(by_twinkle) == _tokens(by_tinker)
    from_training = saved["training"].create_sampling_client(_twinkle(saved["sampler"]))
    assert _tokens(from_training.result(TIMEOUT_S)) == _tokens(by_tinker)


def test_the_async_forms_take_a_twinkle_path_too(saved):
    async def both() -> tuple:
        run = await saved["rest"].get_training_run_by_tinker_path_async(_twinkle(saved["state"]))
        sampling = await saved["service"].create_sampling_client(
            model_path=_twinkle(saved["state"])
        )
        return run, sampling

    run, by_twinkle = asyncio.run(both())
    assert run.training_run_id == saved["training"].model_id
    by_tinker = saved["service"].create_sampling_client(model_path=saved["state"])
    assert _tokens(by_twinkle) == _tokens(by_tinker.result(TIMEOUT_S))


def test_training_clients_resume_from_a_twinkle_path(saved, base_model):
    service, training = saved["service"], saved["training"]
    expected = _logprobs(training)
    for create in (
        service.create_training_client_from_state,
        service.create_training_client_from_state_with_optimizer,
    ):
        resumed = create(_twinkle(saved["state"])).result(TIMEOUT_S)
        assert resumed.model_id != training.model_id
        np.testing.assert_allclose(_logprobs(resumed), expected, rtol=0, atol=1e-6)
    fresh = service.create_lora_training_client(base_model=base_model, rank=4).result(TIMEOUT_S)
    assert np.abs(_logprobs(fresh) - expected).max() > 1e-3  # a fresh adapter differs
    for load in (fresh.load_state, fresh.load_state_with_optimizer):
        load(_twinkle(saved["state"])).result(TIMEOUT_S)
        np.testing.assert_allclose(_logprobs(fresh), expected, rtol=0, atol=1e-6)


def test_rest_calls_take_a_twinkle_path(saved):
    rest, state = saved["rest"], _twinkle(saved["state"])
    run = rest.get_training_run_by_tinker_path(state).result(TIMEOUT_S)
    assert run.training_run_id == saved["training"].model_id
    info = rest.get_weights_info_by_tinker_path(state).result(TIMEOUT_S)
    assert info.is_lora and info.lora_rank == 4
    parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(state)
    assert parsed.tinker_path == saved["state"] and parsed.checkpoint_id == "weights/tw-state"

    extra = saved["training"].save_state("tw-doomed").result(TIMEOUT_S).path
    # The server's own answer: the twinkle:// path got past the SDK to the TTL route.
    with pytest.raises(tinker.BadRequestError, match="limits.max_checkpoint_ttl_s"):
        rest.set_checkpoint_ttl_from_tinker_path(_twinkle(extra), -1).result(TIMEOUT_S)
    rest.set_checkpoint_ttl_from_tinker_path(_twinkle(extra), 3600).result(TIMEOUT_S)
    listed = rest.list_checkpoints(run.training_run_id).result(TIMEOUT_S).checkpoints
    assert [c.expires_at is not None for c in listed if c.tinker_path == extra] == [True]
    rest.delete_checkpoint_from_tinker_path(_twinkle(extra)).result(TIMEOUT_S)
    listed = rest.list_checkpoints(run.training_run_id).result(TIMEOUT_S).checkpoints
    paths = [checkpoint.tinker_path for checkpoint in listed]
    assert extra not in paths and saved["state"] in paths


def test_another_key_twinkle_path_is_refused_like_its_tinker_path(tinker_server, saved):
    url, key_b = tinker_server.base_url, tinker_server.key_b
    other = tinker.ServiceClient(base_url=url, api_key=key_b)
    rest_b = tinker.RestClient(base_url=url, api_key=key_b)
    calls = {
        "create_sampling_client": lambda p: other.create_sampling_client(model_path=p).result(
            TIMEOUT_S
        ),
        "create_training_client_from_state": lambda p: other.create_training_client_from_state(
            p
        ).result(TIMEOUT_S),
        "get_weights_info_by_tinker_path": lambda p: rest_b.get_weights_info_by_tinker_path(
            p
        ).result(TIMEOUT_S),
        "delete_checkpoint_from_tinker_path": lambda p: rest_b.delete_checkpoint_from_tinker_path(
            p
        ).result(TIMEOUT_S),
    }
    try:
        for name, call in calls.items():
            refusals = []
            for path in (saved["state"], _twinkle(saved["state"])):
                with pytest.raises((tinker.NotFoundError, tinker.RequestFailedError)) as caught:
                    call(path)
                refusals.append((type(caught.value), getattr(caught.value, "status_code", None)))
            assert refusals[0] == refusals[1], (name, refusals)
    finally:
        other.close("success").result(TIMEOUT_S)
    listed = saved["rest"].list_checkpoints(saved["training"].model_id).result(TIMEOUT_S)
    assert saved["state"] in [checkpoint.tinker_path for checkpoint in listed.checkpoints]


def test_without_init_tinker_client_the_sdk_is_untouched():
    code = (
        "import tinker\n"
        "from tinker import ServiceClient, types\n"
        "assert not hasattr(ServiceClient.create_sampling_client, '__twinkle_paths__')\n"
        "try:\n"
        "    types.ParsedCheckpointTinkerPath.from_tinker_path('twinkle://r:train:0/weights/a')\n"
        "except ValueError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('the SDK took a twinkle:// path on its own')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_documents_sampling_example_runs_from_a_twinkle_path(tinker_server, saved):
    env = {
        **os.environ,
        "TWINKLE_SERVER_URL": tinker_server.base_url,
        "TWINKLE_SERVER_TOKEN": tinker_server.key_a,
        "OMP_NUM_THREADS": "1",
    }
    for name in ("TINKER_BASE_URL", "TINKER_API_KEY"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, str(SAMPLE), "--model-path", _twinkle(saved["state"]), "--max-tokens=8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "Responses:" in out and "0: '" in out, out[-2000:]
