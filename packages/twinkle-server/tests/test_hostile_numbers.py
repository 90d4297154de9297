"""Hostile numbers on the Tinker routes and both sampler routes, in process.

Each case is sent as the raw JSON a client could write (NaN and Infinity included, which
Python's JSON reader accepts); it must be a 4xx naming the field and its range, and after
it the server must serve a normal request on the same connection with the adapter
unchanged and finite. Also here: results holding NaN or infinities come back readable,
futures lost to a restart answer 410, and a forward_backward without a seq_id is refused.
"""

from __future__ import annotations

import json
import math

import orjson
import pytest
import torch
from fastapi.testclient import TestClient
from pydantic import TypeAdapter
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.types import OptimStepResponse

from twinkle.server.app import create_app
from twinkle.server.auth import create_key
from twinkle.server.config import ServerConfig
from twinkle.server.state import build_state
from twinkle.server.tinker import proto_schema
from twinkle.server.tinker.results import PROTO_MEDIA_TYPE

TOKENS = [5, 9, 17, 33, 2, 40]
TARGETS = [9, 17, 33, 2, 40, 7]
PROMPT = [5, 17, 42, 9, 88, 3, 61]
NAN, INF = float("nan"), float("inf")


def config(home) -> ServerConfig:
    return ServerConfig.model_validate(
        {
            "model": {"model_id": "bundled://tiny-qwen3", "max_loras": 3, "device": "cpu"},
            "sampler": {"enabled": True, "kind": "torch", "max_tokens": 16},
            "storage": {"home": str(home)},
        }
    )


class Tenant:
    """One key on the in-process server, sending raw JSON (NaN allowed) over one client."""

    def __init__(self, http: TestClient, key: str) -> None:
        self.http, self.headers = http, {"X-API-Key": key}
        self.session = self.post("/create_session", {}).json()["session_id"]
        self.seq = 0

    def post(self, path: str, body: dict, accept: str = "application/json"):
        headers = {**self.headers, "Content-Type": "application/json", "Accept": accept}
        return self.http.post(f"/api/v1{path}", content=json.dumps(body), headers=headers)

    def result(self, request_id: str, accept: str = "application/json"):
        response = self.post("/retrieve_future", {"request_id": request_id}, accept)
        assert response.status_code == 200, response.text
        return response

    def done(self, path: str, body: dict) -> dict:
        submitted = self.post(path, body)
        assert submitted.status_code == 200, submitted.text
        result = self.result(submitted.json()["request_id"]).json()
        assert "error" not in result, result
        return result

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


def fwd_body(model_id: str, seq_id: int | None, weights=None, **extra) -> dict:
    weights = [1.0] * len(TARGETS) if weights is None else weights
    datum = {
        "model_input": {"chunks": [{"tokens": TOKENS}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": TARGETS, "dtype": "int64"},
            "weights": {"data": weights, "dtype": "float32"},
        },
    }
    body = {"forward_backward_input": {"data": [datum], "loss_fn": "cross_entropy", **extra}}
    return {**body, "model_id": model_id, "seq_id": seq_id}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    state = build_state(config(tmp_path_factory.mktemp("home")))
    key = create_key(state.store, "alice")[0]
    with TestClient(create_app(state), raise_server_exceptions=False) as http:
        tenant = Tenant(http, key)
        create = {
            "session_id": tenant.session,
            "model_seq_id": 0,
            "base_model": "bundled://tiny-qwen3",
            "lora_config": {"rank": 4},
        }
        model_id = tenant.done("/create_model", create)["model_id"]
        # One real step, so LoRA B is non-zero and a poisoned step would show.
        tenant.done("/forward_backward", fwd_body(model_id, tenant.next_seq()))
        step = {"model_id": model_id, "seq_id": tenant.next_seq(), "adam_params": {}}
        tenant.done("/optim_step", step)
        yield state, tenant, model_id
    state.close()


def adapter_weights(state, model_id: str) -> dict[str, torch.Tensor]:
    adapter = state.model.live[model_id].adapter
    params = state.model.model.model.named_parameters()
    return {name: p.detach().clone() for name, p in params if f".{adapter}." in name}


def assert_still_serving(state, tenant: Tenant, model_id: str, before: dict) -> None:
    """A normal forward on the same connection answers, and the adapter did not move."""
    result = tenant.done("/forward", {**_as_forward(fwd_body(model_id, tenant.next_seq()))})
    assert all(math.isfinite(v) for v in result["loss_fn_outputs"][0]["logprobs"]["data"])
    after = adapter_weights(state, model_id)
    assert after.keys() == before.keys() and before
    for name, tensor in after.items():
        assert torch.isfinite(tensor).all(), name
        assert torch.equal(tensor, before[name]), f"{name} changed"


def _as_forward(body: dict) -> dict:
    return {"forward_input": body.pop("forward_backward_input"), **body}


ADAM_CASES = [
    ({"learning_rate": NAN}, "adam_params.learning_rate must be a finite number in (0, inf)"),
    ({"learning_rate": -1.0}, "adam_params.learning_rate must be a finite number in (0, inf)"),
    ({"learning_rate": INF}, "adam_params.learning_rate must be a finite number"),
    ({"beta1": NAN}, "adam_params.beta1 must be a finite number in [0, 1)"),
    ({"beta1": 5.0}, "adam_params.beta1 must be a finite number in [0, 1), got 5.0"),
    ({"beta2": 1.0}, "adam_params.beta2 must be a finite number in [0, 1)"),
    ({"eps": NAN}, "adam_params.eps must be a finite number in (0, inf)"),
    ({"eps": 0.0}, "adam_params.eps must be a finite number in (0, inf)"),
    ({"weight_decay": INF}, "adam_params.weight_decay must be a finite number in [0, inf)"),
    ({"grad_clip_norm": NAN}, "adam_params.grad_clip_norm must be a finite number in [0, inf)"),
    ({"grad_clip_norm": -1.0}, "adam_params.grad_clip_norm must be a finite number"),
    # the SDKs write NaN/inf as null (pydantic's JSON mode): never "use the default"
    ({"learning_rate": None}, "adam_params learning_rate is null"),
    ({"beta1": None, "eps": None}, "adam_params beta1, eps are null"),
]


@pytest.mark.parametrize(("adam", "message"), ADAM_CASES)
def test_optim_step_refuses_non_finite_or_out_of_range_adam_params(hostile, adam, message):
    state, tenant, model_id = hostile
    before = adapter_weights(state, model_id)
    tenant.done("/forward_backward", fwd_body(model_id, tenant.next_seq()))  # gradients waiting
    body = {"model_id": model_id, "seq_id": tenant.next_seq(), "adam_params": adam}
    response = tenant.post("/optim_step", body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]
    assert response.json()["category"] == "user"
    assert_still_serving(state, tenant, model_id, before)


LORA_CASES = [
    ({"rank": 4, "lora_alpha": NAN}, "lora_config keys ['lora_alpha'] are unknown"),
    ({"rank": 4, "bias": "evil"}, "lora_config keys ['bias'] are unknown"),
    ({"rank": NAN}, "lora_config.rank must be an int in [1, "),
    ({"rank": 4, "seed": 2**70}, "lora_config.seed must be an int in [0, 9223372036854775807]"),
]


@pytest.mark.parametrize(("lora", "message"), LORA_CASES)
def test_create_model_refuses_unknown_or_out_of_range_lora_config(hostile, lora, message):
    state, tenant, model_id = hostile
    before, slots = adapter_weights(state, model_id), len(state.model.live)
    body = {"session_id": tenant.session, "model_seq_id": 7, "lora_config": lora}
    response = tenant.post("/create_model", body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]
    assert len(state.model.live) == slots  # no slot taken
    assert_still_serving(state, tenant, model_id, before)


def _proto_fwdbwd(model_id: str, seq_id: int | None) -> bytes:
    """A forward_backward as SDK 0.38 builds it, its seq_id 0 or left out."""
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(TOKENS),
        loss_fn_inputs={"target_tokens": TARGETS, "weights": [1.0] * len(TARGETS)},
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy"),
        model_id=model_id,
        seq_id=seq_id or 0,
    )
    msg = forward_backward_request_to_proto(request)
    if seq_id is None:
        msg.ClearField("seq_id")
    return msg.SerializeToString()


@pytest.mark.parametrize("seq_id", [None, 0])
def test_a_protobuf_forward_backward_without_a_seq_id_is_refused(hostile, seq_id):
    """Protobuf reads a missing seq_id as 0, the model's creation: answering with that
    future would report success for work that never ran."""
    state, tenant, model_id = hostile
    before = adapter_weights(state, model_id)
    headers = {**tenant.headers, "Content-Type": PROTO_MEDIA_TYPE}
    content = _proto_fwdbwd(model_id, seq_id)
    response = tenant.http.post("/api/v1/forward_backward", content=content, headers=headers)
    assert response.status_code == 400, response.text
    assert "seq_id" in response.json()["error"]
    assert_still_serving(state, tenant, model_id, before)


@pytest.mark.parametrize(
    ("seq_id", "message"),
    [(None, "needs its seq_id"), (0, "seq_id must be an int in [1, "), (1.5, "seq_id must be")],
)
def test_json_requests_without_a_usable_seq_id_are_refused(hostile, seq_id, message):
    state, tenant, model_id = hostile
    before = adapter_weights(state, model_id)
    for path, body in (
        ("/forward_backward", fwd_body(model_id, seq_id)),
        ("/optim_step", {"model_id": model_id, "seq_id": seq_id, "adam_params": {}}),
    ):
        response = tenant.post(path, body)
        assert response.status_code == 400, (path, response.text)
        assert message in response.json()["error"], (path, response.text)
    assert_still_serving(state, tenant, model_id, before)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"temperature": 1.0}, "loss_fn_config keys ['temperature'] are not accepted"),
        ({"beta": NAN}, "loss_fn_config keys ['beta'] are not accepted"),
    ],
)
def test_unknown_loss_fn_config_keys_are_refused(hostile, config, message):
    state, tenant, model_id = hostile
    before = adapter_weights(state, model_id)
    response = tenant.post(
        "/forward_backward", fwd_body(model_id, tenant.next_seq(), loss_fn_config=config)
    )
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]
    assert_still_serving(state, tenant, model_id, before)


def test_a_result_holding_infinities_is_answered_in_both_encodings(hostile):
    """Weights of 3e38 overflow the float32 loss sum: the result must still come back, as
    protobuf (a double) and as JSON the SDK's models read (orjson refuses bare Infinity)."""
    state, tenant, model_id = hostile
    before = adapter_weights(state, model_id)
    body = _as_forward(fwd_body(model_id, tenant.next_seq(), weights=[3e38] * len(TARGETS)))
    request_id = tenant.post("/forward", body).json()["request_id"]
    as_json = tenant.result(request_id)
    # SDK 0.16.1 reads this JSON; its ForwardBackwardOutput.metrics is a Dict[str, float]
    metrics = orjson.loads(as_json.content)["metrics"]
    assert TypeAdapter(dict[str, float]).validate_python(metrics)["loss:sum"] == math.inf
    as_proto = proto_schema.message("ForwardBackwardOutput")()
    as_proto.ParseFromString(tenant.result(request_id, PROTO_MEDIA_TYPE).content)
    assert as_proto.metrics["loss:sum"] == math.inf
    assert_still_serving(state, tenant, model_id, before)


def test_json_safe_metrics_read_back_as_the_sdks_floats():
    from twinkle.server.tinker.results import json_safe

    body = json.dumps(json_safe({"metrics": {"a": NAN, "b": INF, "c": -INF, "d": 1.5}}))
    metrics = OptimStepResponse.model_validate(orjson.loads(body)).metrics
    assert math.isnan(metrics["a"]) and metrics["b"] == INF and metrics["c"] == -INF
    assert metrics["d"] == 1.5


# ---- sampling: Tinker's asample and the Twinkle sampler route ---------------------------

SAMPLING_CASES = [
    ({"temperature": NAN}, "sampling_params.temperature must be a finite number in [0, inf)"),
    ({"temperature": INF}, "sampling_params.temperature must be a finite number"),
    ({"temperature": -1.0}, "sampling_params.temperature must be a finite number"),
    ({"top_p": NAN}, "sampling_params.top_p must be a finite number in (0, 1]"),
    ({"top_p": 1.5}, "sampling_params.top_p must be a finite number in (0, 1]"),
    ({"top_k": 10**9}, "sampling_params.top_k must be an int in [1, "),
    ({"top_k": 0}, "(or -1 to disable top-k)"),
    ({"seed": 2**70}, "sampling_params.seed must be an int in [0, 9223372036854775807]"),
    ({"seed": -1}, "sampling_params.seed must be an int in [0, "),
    ({"stop": [-1]}, "sampling_params.stop[0] (a token id) must be an int in [0, "),
    ({"stop": [10**9]}, "sampling_params.stop[0] (a token id) must be an int in [0, "),
    ({"stop": ["a", ""]}, "sampling_params.stop[1] is an empty string"),
    ({"max_tokens": 0}, "sampling_params.max_tokens must be an int in [1, 16]"),
    ({"max_tokens": 17}, "max_tokens 17 exceeds this server's limit, 16"),
]


TINKER_ONLY_CASES = [
    ({"temperature": None}, "sampling_params temperature is null"),
    ({"top_p": None, "top_k": None}, "sampling_params top_k, top_p are null"),
]


def _asample(tenant: Tenant, sampler_id: str, params: dict):
    body = {
        "sampling_session_id": sampler_id,
        "seq_id": tenant.next_seq(),
        "num_samples": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
        "sampling_params": {"max_tokens": 2, **params},
    }
    return tenant.post("/asample", body)


@pytest.fixture(scope="module")
def sampler_id(hostile):
    state, tenant, _ = hostile
    body = {
        "session_id": tenant.session,
        "sampling_session_seq_id": 0,
        "base_model": state.model.base_model,
    }
    response = tenant.post("/create_sampling_session", body)
    assert response.status_code == 200, response.text
    return response.json()["sampling_session_id"]


@pytest.mark.parametrize(("params", "message"), SAMPLING_CASES + TINKER_ONLY_CASES)
def test_asample_refuses_out_of_range_sampling_params(hostile, sampler_id, params, message):
    state, tenant, model_id = hostile
    response = _asample(tenant, sampler_id, params)
    assert response.status_code in (400, 413), response.text
    assert message in response.json()["error"], response.text
    normal = _asample(tenant, sampler_id, {"seed": 3})
    assert normal.status_code == 200, normal.text
    result = tenant.result(normal.json()["request_id"]).json()
    assert len(result["sequences"][0]["tokens"]) >= 1, result


@pytest.mark.parametrize(("params", "message"), SAMPLING_CASES)
def test_the_twinkle_sampler_refuses_out_of_range_sampling_params(hostile, params, message):
    state, tenant, _ = hostile
    inputs = [{"input_ids": PROMPT}]
    body = {"inputs": inputs, "sampling_params": {"max_tokens": 2, **params}}
    response = tenant.post("/twinkle/sampler/sample", body)
    assert response.status_code in (400, 413), response.text
    assert message in response.json()["error"], response.text
    normal = tenant.post(
        "/twinkle/sampler/sample", {"inputs": inputs, "sampling_params": {"max_tokens": 2}}
    )
    assert normal.status_code == 200, normal.text
    assert len(normal.json()["result"]["sequences"]) == 1


# ---- futures lost to a restart -----------------------------------------------------------


def test_a_future_lost_to_a_restart_answers_410_at_once(tmp_path):
    """A future pending when the server stopped: Tinker's poll and a Twinkle retry with
    the same idempotency key both get 410 (final for both clients), not a retried 500."""
    first = build_state(config(tmp_path))
    key = create_key(first.store, "alice")[0]
    owner = first.principal(key).key_id
    future_id, _ = first.futures.reserve(owner, "forward_backward", "retry-key-1")
    first.close()  # the work never ran: the process is gone
    second = build_state(config(tmp_path))
    try:
        with TestClient(create_app(second), raise_server_exceptions=False) as http:
            tenant = Tenant(http, key)
            polled = tenant.post("/retrieve_future", {"request_id": future_id})
            assert polled.status_code == 410, polled.text
            assert polled.json()["code"] == "lost" and "submit it again" in polled.json()["error"]
            retried = http.post(
                "/api/v1/twinkle/sampler/sample",
                json={"inputs": [{"input_ids": PROMPT}], "sampling_params": {"max_tokens": 2}},
                headers={**tenant.headers, "X-Idempotency-Key": "retry-key-1"},
            )
            # 410 code lost: the Twinkle client raises RequestLostError at once on it
            # (twinkle-client's test_transport), the Tinker SDK stops polling
            assert retried.status_code == 410, retried.text
            assert retried.json()["code"] == "lost", retried.text
            assert "submit it again" in retried.json()["error"], retried.text
            assert tenant.post("/create_session", {}).status_code == 200  # still serving
    finally:
        second.close()


def test_twinkle_route_results_keep_nan_as_the_twinkle_client_reads_it():
    """A diverged loss on a Twinkle route is an answer (Python's json reads NaN back), not
    a 500 from a strict encoder after the work was done."""
    from twinkle.server.app import ResultJSONResponse

    decoded = json.loads(ResultJSONResponse({"loss": NAN, "grad_norm": -INF}).body)
    assert math.isnan(decoded["loss"]) and decoded["grad_norm"] == -INF


# ---- the Twinkle model routes: LoRA settings and gradient clipping ----------------------

FEATURE = {"input_ids": TOKENS, "labels": [-100, -100, *TARGETS[2:]]}


@pytest.fixture(scope="module")
def twinkle_run(hostile):
    state, tenant, _ = hostile
    body = {"session_id": tenant.session, "config": {"r": 4, "target_modules": "all-linear"}}
    response = tenant.post("/twinkle/model/add_adapter_to_model", body)
    assert response.status_code == 200, response.text
    return response.json()["result"]["training_run_id"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"lora_alpha": NAN}, ("lora_alpha", "must be a finite number", "got nan")),
        ({"lora_alpha": -8}, "lora_config lora_alpha must be a finite number in (0, inf)"),
        ({"lora_dropout": NAN}, ("lora_dropout", "must be a finite number", "got nan")),
        ({"lora_dropout": 1.0}, "lora_config lora_dropout must be a finite number in [0, 1)"),
        ({"bias": "evil"}, "lora_config bias must be one of none, all, lora_only, got 'evil'"),
        ({"use_rslora": "yes"}, "lora_config use_rslora must be true or false"),
        ({"target_modules": 5}, "lora_config target_modules must be a module name or a non-"),
        ({"target_modules": []}, "target_modules must be a module name or a non-empty list"),
        ({"target_modules": ["q_proj", 1]}, "got ['q_proj', 1]"),
    ],
)
def test_add_adapter_refuses_bad_lora_values(hostile, twinkle_run, config, message):
    state, tenant, _ = hostile
    before, slots = adapter_weights(state, twinkle_run), len(state.model.live)
    body = {"session_id": tenant.session, "config": {"r": 4, **config}}
    response = tenant.post("/twinkle/model/add_adapter_to_model", body)
    assert response.status_code == 400, response.text
    for words in [message] if isinstance(message, str) else message:
        assert words in response.json()["error"], response.text
    assert len(state.model.live) == slots
    loss = tenant.post(
        "/twinkle/model/forward_only",
        {"training_run_id": twinkle_run, "args": {"inputs": [FEATURE]}},
    )
    assert loss.status_code == 200, loss.text
    assert_unchanged(before, adapter_weights(state, twinkle_run))


@pytest.mark.parametrize(
    ("method", "args", "message"),
    [
        ("clip_grad_norm", {"max_norm": NAN}, ("max_norm", "must be a finite number", "nan")),
        ("clip_grad_norm", {"max_norm": -1.0}, "clip_grad_norm max_norm must be a finite number"),
        ("clip_grad_norm", {"max_norm": 0}, "in (0, inf), got 0"),
        ("clip_grad_and_step", {"max_grad_norm": INF}, ("max_grad_norm", "finite", "inf")),
    ],
)
def test_gradient_clipping_refuses_non_positive_or_non_finite_norms(
    hostile, twinkle_run, method, args, message
):
    state, tenant, _ = hostile
    call = lambda name, **kw: tenant.post(  # noqa: E731
        f"/twinkle/model/{name}", {"training_run_id": twinkle_run, "args": kw}
    )
    before = adapter_weights(state, twinkle_run)
    assert call("forward_backward", inputs=[FEATURE]).status_code == 200
    response = call(method, **args)
    assert response.status_code == 400, response.text
    for words in [message] if isinstance(message, str) else message:
        assert words in response.json()["error"], response.text
    assert_unchanged(before, adapter_weights(state, twinkle_run))
    norm = call("clip_grad_norm", max_norm=1e9)  # the gradients are intact and finite
    assert norm.status_code == 200, norm.text
    assert math.isfinite(norm.json()["result"]) and norm.json()["result"] > 0
    assert call("zero_grad").status_code == 200


def assert_unchanged(before: dict, after: dict) -> None:
    assert after.keys() == before.keys() and before
    for name, tensor in after.items():
        assert torch.isfinite(tensor).all() and torch.equal(tensor, before[name]), name


def test_a_twinkle_run_in_a_session_with_a_tinker_model_takes_the_next_free_id(
    hostile, twinkle_run
):
    """Tinker's create_model chooses its model_seq_id (0 here); the Twinkle route's own
    counter must skip it instead of failing on the taken id (a 500 before)."""
    _, tenant, model_id = hostile
    assert model_id == f"{tenant.session}:train:0"
    assert twinkle_run.startswith(f"{tenant.session}:train:") and twinkle_run != model_id
