"""Bad requests are answered with user errors that the unmodified SDK raises as such.

"User error" means either a 4xx with a JSON body at submit time (the SDK raises
BadRequestError / NotFoundError / UnprocessableEntityError at once, never retrying), or a
future that fails with category "user" (RequestFailedError). Each message must name what is
wrong. A failed request must not wedge the client: the next good request on the same model
(the next seq_id) still runs, without first waiting out a gap in the seq_id order.
"""

from __future__ import annotations

import time

import httpx
import pytest
import tinker
from tinker import types

TIMEOUT_S = 120
TOKENS = [5, 6, 7, 8, 9, 10]
NEXT_STEP_S = 5.0
RETRIED = {408, 409, 429}  # statuses the SDK retries: never an answer to a bad request


def _datum(tokens: list[int], targets: list[int] | None = None, **inputs) -> types.Datum:
    targets = tokens[1:] if targets is None else targets
    loss_fn_inputs = {
        "target_tokens": types.TensorData(data=targets, dtype="int64", shape=[len(targets)]),
        "weights": types.TensorData(
            data=[1.0] * len(targets), dtype="float32", shape=[len(targets)]
        ),
    }
    loss_fn_inputs.update(inputs)
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=loss_fn_inputs
    )


def _floats(values: list[float]) -> types.TensorData:
    return types.TensorData(data=values, dtype="float32", shape=[len(values)])


def assert_user_error(call, *words: str) -> Exception:
    """``call()`` fails as a user error whose message contains every one of ``words``."""
    with pytest.raises((tinker.APIStatusError, tinker.RequestFailedError)) as caught:
        call()
    error = caught.value
    if isinstance(error, tinker.APIStatusError):
        assert 400 <= error.status_code < 500 and error.status_code not in RETRIED, error
        message = str(error.body if error.body is not None else error)
    else:
        assert error.category == types.RequestErrorCategory.User, error
        message = error.message
    for word in words:
        assert word.lower() in message.lower(), (word, message)
    return error


@pytest.fixture(scope="module")
def service(tinker_server):
    client = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.key_a)
    yield client
    client.close("success").result(TIMEOUT_S)


@pytest.fixture(scope="module")
def training(service, base_model):
    return service.create_lora_training_client(base_model=base_model, rank=4).result(TIMEOUT_S)


def _still_trains(training) -> None:
    """The next seq_ids run, and at once: a rejected seq_id must not leave a gap that the
    server's reorder buffer waits out (its gap timeout is 10 s; a step takes well under 1 s)."""
    start = time.monotonic()
    out = training.forward_backward([_datum(TOKENS)], "cross_entropy").result(TIMEOUT_S)
    assert out.metrics["loss:sum"] > 0
    training.optim_step(types.AdamParams(learning_rate=1e-4)).result(TIMEOUT_S)
    elapsed = time.monotonic() - start
    assert elapsed < NEXT_STEP_S, f"the next step took {elapsed:.1f} s: a gap was waited out"


def test_unknown_loss_is_a_user_error(training):
    assert_user_error(
        lambda: training.forward_backward([_datum(TOKENS)], "not_a_loss").result(TIMEOUT_S),
        "not_a_loss",
    )
    _still_trains(training)


def test_unknown_loss_config_key_is_a_user_error(training):
    datum = _datum(
        TOKENS, logprobs=_floats([-1.0] * 5), advantages=_floats([1.0, 0.0, -1.0, 0.5, 0.0])
    )
    assert_user_error(
        lambda: training.forward_backward([datum], "ppo", {"clip_sideways_threshold": 0.5}).result(
            TIMEOUT_S
        ),
        "clip_sideways_threshold",
    )
    _still_trains(training)


def test_target_tokens_of_the_wrong_length_are_a_user_error(training):
    short = _datum(TOKENS, targets=TOKENS[1:-1])
    assert_user_error(
        lambda: training.forward_backward([short], "cross_entropy").result(TIMEOUT_S),
        "target_tokens",
    )
    _still_trains(training)


def test_missing_loss_inputs_are_a_user_error(training):
    no_advantages = _datum(TOKENS, logprobs=_floats([-1.0] * 5))
    assert_user_error(
        lambda: training.forward_backward([no_advantages], "importance_sampling").result(TIMEOUT_S),
        "advantages",
    )
    _still_trains(training)


def test_a_token_outside_the_vocabulary_is_a_user_error(training):
    huge = 10**9
    assert_user_error(
        lambda: training.forward_backward([_datum([1, 2, huge, 4])], "cross_entropy").result(
            TIMEOUT_S
        ),
        "vocab",
    )
    _still_trains(training)


def test_an_image_chunk_is_a_user_error(training):
    image = types.ImageChunk(data=b"\x89PNG....", format="png", expected_tokens=4)
    datum = types.Datum(
        model_input=types.ModelInput(chunks=[image]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=[1] * 4, dtype="int64", shape=[4]),
            "weights": _floats([1.0] * 4),
        },
    )
    assert_user_error(
        lambda: training.forward_backward([datum], "cross_entropy").result(TIMEOUT_S), "image"
    )
    _still_trains(training)


def test_an_unknown_base_model_is_a_user_error(service, base_model):
    error = assert_user_error(
        lambda: service.create_lora_training_client(base_model="no-such/model", rank=4).result(
            TIMEOUT_S
        ),
        "no-such/model",
    )
    assert base_model in str(error)  # the message says which model is served


def test_a_rank_over_the_limit_is_a_user_error(service, base_model):
    assert_user_error(
        lambda: service.create_lora_training_client(base_model=base_model, rank=4096).result(
            TIMEOUT_S
        ),
        "rank",
    )


def test_an_unknown_checkpoint_path_is_a_user_error(service):
    missing = "tinker://sess-none:train:0/sampler_weights/nothing"
    assert_user_error(
        lambda: service.create_sampling_client(model_path=missing).result(TIMEOUT_S),
        "sess-none:train:0",
        "nothing",
    )
    assert_user_error(
        lambda: service.create_training_client_from_state(
            "tinker://sess-none:train:0/weights/nothing"
        ).result(TIMEOUT_S),
        "sess-none:train:0",
        "nothing",
    )


def test_an_unsupported_sampling_extra_is_a_user_error(training):
    sampling = training.save_weights_and_get_sampling_client().result(TIMEOUT_S)
    prompt = types.ModelInput.from_ints(TOKENS)
    params = types.SamplingParams(max_tokens=2)
    assert_user_error(
        lambda: sampling.sample(prompt, 1, params, prompt_alt_tokens_k=3).result(TIMEOUT_S),
        "prompt_alt_tokens_k",
    )
    done = sampling.sample(prompt, 1, params).result(TIMEOUT_S)
    assert len(done.sequences) == 1


def test_a_wrong_api_key_is_refused(tinker_server):
    def list_runs():
        rest = tinker.RestClient(base_url=tinker_server.base_url, api_key="tml-not-a-real-key")
        rest.list_training_runs().result(TIMEOUT_S)

    with pytest.raises(tinker.AuthenticationError, match="invalid API key"):
        list_runs()


@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [
        ("/api/v1/forward_backward", b"\xff\xfe not protobuf", "application/x-protobuf"),
        ("/api/v1/forward_backward", b'{"model_id": 3}', "application/json"),
        ("/api/v1/optim_step", b'{"seq_id": "one"}', "application/json"),
        ("/api/v1/create_model", b"[1, 2", "application/json"),
    ],
)
def test_malformed_bodies_get_a_4xx_with_a_json_body(tinker_server, path, body, headers):
    """A bare 4xx would make the SDK retry it as a proxy glitch (SPEC section 2)."""
    reply = httpx.post(
        tinker_server.base_url + path,
        content=body,
        headers={"X-API-Key": tinker_server.key_a, "Content-Type": headers},
        timeout=30,
    )
    assert 400 <= reply.status_code < 500 and reply.status_code not in RETRIED, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.json()  # a non-empty JSON body that says what is wrong
