"""Two SDK clients with different keys: neither can see, use or change the other's things.

Tenant A trains a run, saves a checkpoint and opens a sampler; tenant B must get "not found"
for all of them (never A's data, never a hint that they exist), and B's training must not
move A's adapter.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tinker
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

TIMEOUT_S = 120
TOKENS = [3, 14, 15, 92, 65, 35, 89, 79]


def _datum(tokens: list[int]) -> types.Datum:
    n = len(tokens) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=tokens[1:], dtype="int64", shape=[n]),
            "weights": types.TensorData(data=[1.0] * n, dtype="float32", shape=[n]),
        },
    )


def _logprobs(training: tinker.TrainingClient) -> np.ndarray:
    out = training.forward([_datum(TOKENS)], "cross_entropy").result(TIMEOUT_S)
    return np.asarray(out.loss_fn_outputs[0]["logprobs"].to_numpy(), dtype=np.float64)


@pytest.fixture(scope="module")
def tenants(tinker_server, base_model):
    url = tinker_server.base_url
    a = tinker.ServiceClient(base_url=url, api_key=tinker_server.key_a)
    b = tinker.ServiceClient(base_url=url, api_key=tinker_server.key_b)
    train_a = a.create_lora_training_client(base_model=base_model, rank=4).result(TIMEOUT_S)
    train_a.forward_backward([_datum(TOKENS)], "cross_entropy").result(TIMEOUT_S)
    train_a.optim_step(types.AdamParams(learning_rate=1e-3)).result(TIMEOUT_S)
    state = train_a.save_state("a-private").result(TIMEOUT_S).path
    sampler_path = train_a.save_weights_for_sampler("a-sampler").result(TIMEOUT_S).path
    sampling_a = train_a.save_weights_and_get_sampling_client().result(TIMEOUT_S)
    yield {
        "a": a,
        "b": b,
        "rest_a": tinker.RestClient(base_url=url, api_key=tinker_server.key_a),
        "rest_b": tinker.RestClient(base_url=url, api_key=tinker_server.key_b),
        "train_a": train_a,
        "run_a": train_a.model_id,
        "state": state,
        "sampler_path": sampler_path,
        "sampling_a": sampling_a,
    }
    a.close("success").result(TIMEOUT_S)
    b.close("success").result(TIMEOUT_S)


def _assert_not_found(call) -> None:
    """The SDK must raise NotFoundError (a 404), or fail the future as a user error."""
    with pytest.raises((tinker.NotFoundError, tinker.RequestFailedError)) as caught:
        call()
    if isinstance(caught.value, tinker.RequestFailedError):
        assert caught.value.category == types.RequestErrorCategory.User, caught.value


def test_b_does_not_list_a_runs_or_checkpoints(tenants):
    run_a = tenants["run_a"]
    runs_b = tenants["rest_b"].list_training_runs(limit=100).result(TIMEOUT_S)
    assert run_a not in [r.training_run_id for r in runs_b.training_runs]
    checkpoints_b = tenants["rest_b"].list_user_checkpoints(limit=100).result(TIMEOUT_S)
    assert not [
        c for c in checkpoints_b.checkpoints if c.tinker_path.startswith(f"tinker://{run_a}/")
    ]
    runs_a = tenants["rest_a"].list_training_runs(limit=100).result(TIMEOUT_S)
    assert run_a in [r.training_run_id for r in runs_a.training_runs]


def test_b_cannot_read_a_run_checkpoints_weights_info_or_session(tenants):
    rest_b, run_a = tenants["rest_b"], tenants["run_a"]
    session_a = run_a.rsplit(":train:", 1)[0]
    _assert_not_found(lambda: rest_b.get_training_run(run_a).result(TIMEOUT_S))
    _assert_not_found(lambda: rest_b.list_checkpoints(run_a).result(TIMEOUT_S))
    _assert_not_found(
        lambda: rest_b.get_weights_info_by_tinker_path(tenants["state"]).result(TIMEOUT_S)
    )
    _assert_not_found(lambda: rest_b.get_session(session_a).result(TIMEOUT_S))
    assert session_a not in rest_b.list_sessions(limit=100).result(TIMEOUT_S).sessions


def test_b_cannot_delete_a_checkpoint(tenants):
    _assert_not_found(
        lambda: (
            tenants["rest_b"].delete_checkpoint_from_tinker_path(tenants["state"]).result(TIMEOUT_S)
        )
    )
    listed = tenants["rest_a"].list_checkpoints(tenants["run_a"]).result(TIMEOUT_S).checkpoints
    assert tenants["state"] in [c.tinker_path for c in listed]


def test_b_cannot_load_a_checkpoint_into_a_new_client(tenants):
    b = tenants["b"]
    _assert_not_found(
        lambda: b.create_training_client_from_state(tenants["state"]).result(TIMEOUT_S)
    )
    _assert_not_found(
        lambda: b.create_training_client_from_state_with_optimizer(tenants["state"]).result(
            TIMEOUT_S
        )
    )


def test_b_cannot_sample_from_a_weights(tenants):
    b = tenants["b"]
    prompt = types.ModelInput.from_ints(TOKENS[:3])
    params = types.SamplingParams(max_tokens=2)

    def sample_a_path():
        sampling = b.create_sampling_client(model_path=tenants["sampler_path"]).result(TIMEOUT_S)
        sampling.sample(prompt, num_samples=1, sampling_params=params).result(TIMEOUT_S)

    _assert_not_found(sample_a_path)


def test_b_cannot_use_a_model_or_sampler_ids_over_http(tinker_server, tenants):
    """The SDK never sends another tenant's ids, so speak the wire protocol directly."""
    url, headers = tinker_server.base_url, {"X-API-Key": tinker_server.key_b}
    session_a = tenants["run_a"].rsplit(":train:", 1)[0]
    (sampler_a,) = tenants["rest_a"].get_session(session_a).result(TIMEOUT_S).sampler_ids
    calls = [
        ("post", "/api/v1/get_info", {"model_id": tenants["run_a"], "type": "get_info"}),
        ("get", f"/api/v1/samplers/{sampler_a}", None),
        (
            "post",
            "/api/v1/optim_step",
            {
                "model_id": tenants["run_a"],
                "seq_id": 10_000,
                "adam_params": {"learning_rate": 1.0},
                "type": "optim_step",
            },
        ),
        (
            "post",
            "/api/v1/asample",
            {
                "sampling_session_id": sampler_a,
                "seq_id": 10_000,
                "num_samples": 1,
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": TOKENS[:3]}]},
                "sampling_params": {"max_tokens": 2},
                "type": "sample",
            },
        ),
        ("post", f"/api/v1/sessions/{session_a}/finish", {}),
    ]
    for method, path, body in calls:
        reply = httpx.request(method, url + path, json=body, headers=headers, timeout=30)
        assert reply.status_code == 404, (path, reply.status_code, reply.text)
        assert reply.json()["category"] == "user", reply.text

    # forward_backward on A's model, in the SDK's own protobuf encoding.
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=[_datum(TOKENS)], loss_fn="cross_entropy"
        ),
        model_id=tenants["run_a"],
        seq_id=10_000,
    )
    reply = httpx.post(
        url + "/api/v1/forward_backward",
        content=forward_backward_request_to_proto(request).SerializeToString(),
        headers={**headers, "Content-Type": "application/x-protobuf"},
        timeout=30,
    )
    assert reply.status_code == 404, reply.text


def test_b_training_does_not_move_a_adapter(tenants, base_model):
    before = _logprobs(tenants["train_a"])
    train_b = tenants["b"].create_lora_training_client(base_model=base_model, rank=4)
    train_b = train_b.result(TIMEOUT_S)
    start_b = _logprobs(train_b)
    for _ in range(2):
        train_b.forward_backward([_datum(TOKENS)], "cross_entropy").result(TIMEOUT_S)
        train_b.optim_step(types.AdamParams(learning_rate=5e-2)).result(TIMEOUT_S)
    moved_b = _logprobs(train_b)
    after = _logprobs(tenants["train_a"])
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-6)
    assert np.abs(moved_b - start_b).max() > 1e-3  # B's steps did change B's own adapter
