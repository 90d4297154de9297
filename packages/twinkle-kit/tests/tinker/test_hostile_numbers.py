"""The unmodified SDK against hostile numbers and a restart: every call returns or raises
promptly (well under the SDK's own retry horizons), never polling a 5xx to its timeout.

* out-of-range AdamParams (``beta1=5.0``, NaN) fail at once as user errors, and the model
  still trains with its adapter unchanged by them;
* a result holding infinities (a loss sum that overflows float32) comes back;
* a future lost to a server restart (SIGKILL while it waited) raises instead of being
  retried as a 500 until the SDK's timeout.
"""

from __future__ import annotations

import math
import time

import httpx
import pytest
import tinker
from tinker import types

PROMPT_S = 20.0  # "promptly": the SDK retries a 5xx for minutes
TIMEOUT_S = 120
TOKENS = [5, 6, 7, 8, 9, 10]


def _datum(weight: float = 1.0) -> types.Datum:
    targets = TOKENS[1:]
    return types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=targets, dtype="int64", shape=[len(targets)]),
            "weights": types.TensorData(
                data=[weight] * len(targets), dtype="float32", shape=[len(targets)]
            ),
        },
    )


def _timed(call):
    """``call()``'s outcome (its value or the exception it raised) and how long it took."""
    start = time.monotonic()
    try:
        outcome = call()
    except Exception as exc:  # noqa: BLE001 - the outcome is what the test inspects
        outcome = exc
    return outcome, time.monotonic() - start


@pytest.fixture(scope="module")
def service(tinker_server):
    client = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.key_a)
    yield client
    client.close("success").result(TIMEOUT_S)


@pytest.fixture(scope="module")
def training(service, base_model):
    client = service.create_lora_training_client(base_model=base_model, rank=4)
    client = client.result(TIMEOUT_S)
    client.forward_backward([_datum()], "cross_entropy").result(TIMEOUT_S)
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result(TIMEOUT_S)
    return client


def _logprobs(training) -> list[float]:
    out = training.forward([_datum()], "cross_entropy").result(TIMEOUT_S)
    return list(out.loss_fn_outputs[0]["logprobs"].data)


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"beta1": 5.0}, ["adam_params.beta1", "[0, 1)"]),
        ({"learning_rate": math.nan}, ["adam_params learning_rate is null"]),
        ({"eps": math.nan}, ["adam_params eps is null"]),
        ({"weight_decay": math.inf}, ["adam_params weight_decay is null"]),
    ],
)
def test_bad_adam_params_fail_at_once_and_leave_the_adapter(training, params, words):
    """The SDK writes NaN and inf as null (pydantic's JSON mode), which must not read as
    "the default"; beta1=5.0 is refused with the range."""
    before = _logprobs(training)
    training.forward_backward([_datum()], "cross_entropy").result(TIMEOUT_S)
    error, elapsed = _timed(
        lambda: training.optim_step(types.AdamParams(**params)).result(TIMEOUT_S)
    )
    assert isinstance(error, Exception) and not isinstance(error, TimeoutError), error
    assert elapsed < PROMPT_S, f"optim_step took {elapsed:.1f} s to fail"
    assert isinstance(error, tinker.BadRequestError), error
    for word in words:
        assert word in str(error.body), error.body
    assert _logprobs(training) == before  # the refused step changed nothing
    assert all(math.isfinite(v) for v in before)


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"temperature": math.nan}, None),
        ({"top_p": math.inf}, None),
        ({"seed": 2**70}, ["sampling_params.seed", "[0, 9223372036854775807]"]),
        ({"stop": [-1]}, ["sampling_params.stop[0]", "token id"]),
        ({"top_k": 10**9}, ["sampling_params.top_k"]),
    ],
)
def test_bad_sampling_params_fail_at_once(service, base_model, params, words):
    """``words`` None: the SDK's own encoder refuses NaN/inf before sending (the server's
    answer to a null is covered in process); else the server's 400 names the field."""
    sampler = service.create_sampling_client(base_model=base_model)
    prompt = types.ModelInput.from_ints(TOKENS)
    bad = types.SamplingParams(max_tokens=2, **params)
    error, elapsed = _timed(lambda: sampler.sample(prompt, 1, bad).result(TIMEOUT_S))
    assert elapsed < PROMPT_S, f"sample took {elapsed:.1f} s to fail"
    if words is None:
        assert isinstance(error, ValueError) and "JSON compliant" in str(error), error
    else:
        assert isinstance(error, tinker.BadRequestError), error
        for word in words:
            assert word in str(error.body), error.body
    good = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2, seed=1))
    assert len(good.result(TIMEOUT_S).sequences[0].tokens) >= 1


def test_a_loss_that_overflows_is_answered_not_retried(training):
    before = _logprobs(training)
    out, elapsed = _timed(
        lambda: training.forward([_datum(weight=3e38)], "cross_entropy").result(TIMEOUT_S)
    )
    assert not isinstance(out, Exception), out
    assert elapsed < PROMPT_S
    assert out.metrics["loss:sum"] == math.inf
    assert _logprobs(training) == before


def test_a_future_lost_to_a_restart_raises_promptly(server_process, base_model):
    """A forward_backward waits behind a missing seq_id when the server is SIGKILLed and
    started again; the SDK's own future poller (``_APIFuture``, what every training call
    returns) must then raise at once instead of retrying a 500 to its timeout."""
    from tinker.lib.api_future_impl import _APIFuture

    process = server_process(
        "tinker_lost_home",
        {"model": {"model_id": base_model, "max_loras": 2, "device": "cpu"}},
    )
    key = process.cli("keys", "create", "--name", "lost")
    process.start(timeout_s=240)
    service = tinker.ServiceClient(base_url=process.url, api_key=key)
    training = service.create_lora_training_client(base_model=base_model, rank=4)
    training = training.result(TIMEOUT_S)
    body = {
        "model_id": training.model_id,
        "seq_id": 2,  # seq_id 1 never comes: this one waits
        "forward_backward_input": {
            "data": [
                {  # SDK 0.16.1's JSON datum, which the server also reads
                    "model_input": {"chunks": [{"tokens": TOKENS[:-1]}]},
                    "loss_fn_inputs": {"target_tokens": {"data": TOKENS[1:], "dtype": "int64"}},
                }
            ],
            "loss_fn": "cross_entropy",
        },
    }
    headers = {"X-API-Key": key}
    submitted = httpx.post(f"{process.url}/api/v1/forward_backward", json=body, headers=headers)
    assert submitted.status_code == 200, submitted.text
    request_id = submitted.json()["request_id"]
    process.proc.kill()
    process.proc.wait(timeout=30)
    process.start(timeout_s=240)
    future = _APIFuture(
        types.ForwardBackwardOutput,
        training.holder,
        types.UntypedAPIFuture(request_id=request_id, model_id=training.model_id),
        request_start_time=time.time(),
        request_type="ForwardBackward",
    )
    error, elapsed = _timed(lambda: future.result(TIMEOUT_S))
    assert elapsed < PROMPT_S, f"the lost future took {elapsed:.1f} s to fail"
    assert isinstance(error, Exception) and not isinstance(error, TimeoutError), error
    assert "expired" in str(error).lower(), error  # the SDK's RetryableException for a 410
    health = httpx.get(f"{process.url}/api/v1/healthz", timeout=5)
    assert health.status_code == 200  # the restarted server serves
    process.stop()
