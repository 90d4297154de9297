"""Every size a request controls is bounded by ``limits`` and refused before any work, on
the Twinkle and Tinker routes alike, with a 413 naming the limit's key.

Each case goes to an in-process server with small limits; afterwards the same client must
get a normal answer, the adapter must be unchanged and finite, and on the Tinker routes the
model's next seq_id must run at once (a refused request frees its seq_id; one left taken
would stall every later request of that model for the ordering's gap timeout).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

from twinkle.server.app import create_app
from twinkle.server.auth import create_key
from twinkle.server.config import ServerConfig
from twinkle.server.state import build_state
from twinkle.server.tinker.results import PROTO_MEDIA_TYPE

ROWS, TOKENS_PER_ROW, SAMPLES, ELEMENTS, DEPTH = 4, 32, 4, 1024, 16
SEQUENCES = 8  # completions of one sample request in all: under ROWS × SAMPLES
PROMPT = [5, 17, 42, 9, 88, 3, 61]
TOKENS = [5, 9, 17, 33, 2, 40]
TARGETS = [9, 17, 33, 2, 40, 7]
FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}


def config(home) -> ServerConfig:
    return ServerConfig.model_validate(
        {
            "model": {"model_id": "bundled://tiny-qwen3", "max_loras": 3, "device": "cpu"},
            "sampler": {"enabled": True, "kind": "torch", "max_tokens": 8},
            "storage": {"home": str(home)},
            "limits": {
                "max_batch_rows": ROWS,
                "max_sequence_tokens": TOKENS_PER_ROW,
                "max_num_samples": SAMPLES,
                "max_sample_sequences": SEQUENCES,
                "max_tensor_elements": ELEMENTS,
                "max_json_depth": DEPTH,
            },
        }
    )


class Tenant:
    """One key on the in-process server, over one client, counting its Tinker seq_ids."""

    def __init__(self, http: TestClient, key: str) -> None:
        self.http, self.headers = http, {"X-API-Key": key}
        self.session = self.post("/create_session", {}).json()["session_id"]
        self.seq = 0

    def raw(self, path: str, content: bytes | str, media: str = "application/json"):
        headers = {**self.headers, "Content-Type": media}
        return self.http.post(f"/api/v1{path}", content=content, headers=headers)

    def post(self, path: str, body: dict):
        return self.raw(path, json.dumps(body))

    def done(self, path: str, body: dict) -> dict:
        submitted = self.post(path, body)
        assert submitted.status_code == 200, submitted.text
        polled = self.post("/retrieve_future", {"request_id": submitted.json()["request_id"]})
        assert polled.status_code == 200, polled.text
        return polled.json()

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
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
        body = {"session_id": tenant.session, "config": {"r": 4}}
        run = tenant.post("/twinkle/model/add_adapter_to_model", body)
        assert run.status_code == 200, run.text
        run_id = run.json()["result"]["training_run_id"]
        # A real step each, so LoRA B is non-zero and a poisoned step would show.
        tenant.done("/forward_backward", fwd_body(model_id, tenant.next_seq(), [datum()]))
        step = {
            "model_id": model_id,
            "seq_id": tenant.next_seq(),
            "adam_params": {"learning_rate": 1e-3},
        }
        tenant.done("/optim_step", step)
        for method, args in (("forward_backward", {"inputs": [FEATURE]}), ("step", {})):
            body = {"training_run_id": run_id, "args": args}
            assert tenant.post(f"/twinkle/model/{method}", body).status_code == 200
        yield state, tenant, model_id, run_id
    state.close()


def adapter_weights(state, run_id: str) -> dict[str, torch.Tensor]:
    adapter = state.model.live[run_id].adapter
    params = state.model.model.model.named_parameters()
    return {name: p.detach().clone() for name, p in params if f".{adapter}." in name}


def assert_unchanged_and_finite(state, run_id: str, before: dict) -> None:
    after = adapter_weights(state, run_id)
    assert after.keys() == before.keys() and before
    for name, tensor in after.items():
        assert torch.isfinite(tensor).all(), name
        assert torch.equal(tensor, before[name]), f"{name} changed"


def assert_refused(response, key: str) -> None:
    assert response.status_code == 413, response.text
    body = response.json()
    assert body["category"] == "user" and f"limits.{key}" in body["error"], body


def datum(tokens=TOKENS, targets=TARGETS) -> dict:
    return {
        "model_input": {"chunks": [{"tokens": tokens}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": targets, "dtype": "int64"},
            "weights": {"data": [1.0] * len(targets), "dtype": "float32"},
        },
    }


def fwd_body(model_id: str, seq_id: int, data: list[dict]) -> dict:
    payload = {"data": data, "loss_fn": "cross_entropy"}
    return {"forward_backward_input": payload, "model_id": model_id, "seq_id": seq_id}


def assert_tinker_serves(state, tenant: Tenant, model_id: str, before: dict) -> None:
    """The model's next seq_id runs at once (retrieve_future would answer try_again after
    its long poll if the refused seq_id still held the sequence) and moves nothing."""
    body = fwd_body(model_id, tenant.next_seq(), [datum()])
    result = tenant.done("/forward", {"forward_input": body.pop("forward_backward_input"), **body})
    logprobs = result["loss_fn_outputs"][0]["logprobs"]["data"]
    assert len(logprobs) == len(TARGETS) and all(math.isfinite(v) for v in logprobs)
    assert_unchanged_and_finite(state, model_id, before)


def assert_twinkle_serves(state, tenant: Tenant, run_id: str, before: dict) -> None:
    body = {"training_run_id": run_id, "args": {"inputs": [FEATURE]}}
    response = tenant.post("/twinkle/model/forward_only", body)
    assert response.status_code == 200, response.text
    assert math.isfinite(response.json()["result"]["loss"])
    assert_unchanged_and_finite(state, run_id, before)


def sample_body(**extra) -> dict:
    return {"inputs": [{"input_ids": PROMPT}], "sampling_params": {"max_tokens": 1}, **extra}


# ---- the Twinkle sampler -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "key"),
    [
        (sample_body(num_samples=1_000_000), "max_num_samples"),
        (sample_body(num_samples=SAMPLES + 1), "max_num_samples"),
        (
            sample_body(sampling_params={"max_tokens": 1, "num_samples": 1_000_000}),
            "max_num_samples",
        ),
        ({"inputs": [{"input_ids": PROMPT}] * (ROWS + 1)}, "max_batch_rows"),
        ({"inputs": [{"input_ids": [5] * (TOKENS_PER_ROW + 1)}]}, "max_sequence_tokens"),
        (sample_body(inputs=[{"input_ids": PROMPT}] * 3, num_samples=3), "max_sample_sequences"),
        (
            sample_body(inputs=[{"input_ids": PROMPT}] * 3, sampling_params={"num_samples": 3}),
            "max_sample_sequences",
        ),
    ],
)
def test_the_twinkle_sampler_refuses_oversized_requests(limited, body, key):
    state, tenant, _, run_id = limited
    before = adapter_weights(state, run_id)
    assert_refused(tenant.post("/twinkle/sampler/sample", body), key)
    normal = tenant.post("/twinkle/sampler/sample", sample_body(num_samples=SAMPLES))
    assert normal.status_code == 200, normal.text
    assert len(normal.json()["result"]["sequences"]) == SAMPLES  # the limit itself is served
    assert_twinkle_serves(state, tenant, run_id, before)


# ---- the Twinkle model ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("inputs", "key"),
    [
        ([FEATURE] * (ROWS + 1), "max_batch_rows"),
        ([{"input_ids": [1] * (TOKENS_PER_ROW + 1)}], "max_sequence_tokens"),
    ],
)
@pytest.mark.parametrize("method", ["forward_backward", "forward_only"])
def test_the_twinkle_model_refuses_oversized_batches(limited, method, inputs, key):
    state, tenant, _, run_id = limited
    before = adapter_weights(state, run_id)
    body = {"training_run_id": run_id, "args": {"inputs": inputs}}
    assert_refused(tenant.post(f"/twinkle/model/{method}", body), key)
    assert_twinkle_serves(state, tenant, run_id, before)


# ---- Tinker forward_backward and asample ---------------------------------------------------


def _proto(model_id: str, seq_id: int, count: int = 1, tokens=TOKENS) -> object:
    one = types.Datum(
        model_input=types.ModelInput.from_ints(tokens),
        loss_fn_inputs={"target_tokens": tokens[1:] + [7], "weights": [1.0] * len(tokens)},
    )
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(
            data=[one] * count, loss_fn="cross_entropy"
        ),
        model_id=model_id,
        seq_id=seq_id,
    )
    return forward_backward_request_to_proto(request)


def _sparse_weights(msg, shape: list[int]) -> None:
    """The first datum's weights as a CSR tensor of ``shape`` holding no values (its row
    pointers would not match a shape that large: the size is refused first)."""
    weights = msg.data[0].loss_fn_inputs["weights"]
    weights.ClearField("shape")
    weights.shape.extend(shape)
    weights.sparse_csr.crow_indices = np.zeros(2, dtype="<i8").tobytes()
    weights.sparse_csr.col_indices = b""
    weights.sparse_csr.values = b""


def test_tinker_forward_backward_refuses_too_many_datums_or_tokens(limited):
    state, tenant, model_id, _ = limited
    before = adapter_weights(state, model_id)
    cases = [
        ([datum()] * (ROWS + 1), "max_batch_rows"),
        ([datum([5] * (TOKENS_PER_ROW + 1), [9] * (TOKENS_PER_ROW + 1))], "max_sequence_tokens"),
    ]
    for data, key in cases:
        response = tenant.post("/forward_backward", fwd_body(model_id, tenant.next_seq(), data))
        assert_refused(response, key)
        assert_tinker_serves(state, tenant, model_id, before)
    for shape, key in (
        ({"count": ROWS + 1}, "max_batch_rows"),
        ({"tokens": [5] * (TOKENS_PER_ROW + 1)}, "max_sequence_tokens"),
    ):
        msg = _proto(model_id, tenant.next_seq(), **shape)
        response = tenant.raw("/forward_backward", msg.SerializeToString(), PROTO_MEDIA_TYPE)
        assert_refused(response, key)
        assert_tinker_serves(state, tenant, model_id, before)


@pytest.mark.parametrize("shape", [[1, 10**13], [2**32, 2**32]])
def test_a_huge_sparse_tensor_is_refused_before_allocation_and_frees_its_seq_id(limited, shape):
    state, tenant, model_id, _ = limited
    before = adapter_weights(state, model_id)
    msg = _proto(model_id, tenant.next_seq())
    _sparse_weights(msg, shape)
    response = tenant.raw("/forward_backward", msg.SerializeToString(), PROTO_MEDIA_TYPE)
    assert_refused(response, "max_tensor_elements")
    assert f"shape {shape}" in response.json()["error"]
    assert_tinker_serves(state, tenant, model_id, before)

    sparse = {
        "data": [],
        "dtype": "float32",
        "shape": shape,
        "sparse_crow_indices": [0, 0],
        "sparse_col_indices": [],
    }
    body = fwd_body(model_id, tenant.next_seq(), [datum()])
    body["forward_backward_input"]["data"][0]["loss_fn_inputs"]["weights"] = sparse
    assert_refused(tenant.post("/forward_backward", body), "max_tensor_elements")
    assert_tinker_serves(state, tenant, model_id, before)


def test_tinker_asample_takes_the_same_limits(limited):
    state, tenant, model_id, _ = limited
    before = adapter_weights(state, model_id)
    body = {
        "session_id": tenant.session,
        "sampling_session_seq_id": 0,
        "base_model": state.model.base_model,
    }
    sampler_id = tenant.post("/create_sampling_session", body).json()["sampling_session_id"]

    sampling_seq = iter(range(1, 100))  # the sampling session's own seq_ids

    def asample(num_samples: int, prompt: list[int]):
        return tenant.post(
            "/asample",
            {
                "sampling_session_id": sampler_id,
                "seq_id": next(sampling_seq),
                "num_samples": num_samples,
                "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]},
                "sampling_params": {"max_tokens": 1},
            },
        )

    assert_refused(asample(1_000_000, PROMPT), "max_num_samples")
    assert_refused(asample(1, [5] * (TOKENS_PER_ROW + 1)), "max_sequence_tokens")
    normal = asample(SAMPLES, PROMPT)
    assert normal.status_code == 200, normal.text
    polled = tenant.post("/retrieve_future", {"request_id": normal.json()["request_id"]})
    assert len(polled.json()["sequences"]) == SAMPLES, polled.text
    assert_tinker_serves(state, tenant, model_id, before)


# ---- nesting depth, on every route family --------------------------------------------------

ROUTES = [
    "/twinkle/model/forward_backward",
    "/twinkle/sampler/sample",
    "/twinkle/dataset/create",
    "/twinkle/dataloader/next",
    "/create_session",
    "/forward_backward",
    "/optim_step",
    "/asample",
    "/retrieve_future",
]


@pytest.mark.parametrize("path", ROUTES)
def test_deeply_nested_json_is_a_413_on_every_route_family(limited, path):
    state, tenant, model_id, run_id = limited
    before = adapter_weights(state, run_id)
    assert_refused(tenant.raw(path, "[" * 100_000), "max_json_depth")  # a RecursionError before
    nested = "[" * (DEPTH + 1) + "]" * (DEPTH + 1)  # parses, but deeper than the limit
    body = f'{{"training_run_id": "{run_id}", "model_id": "{model_id}", "args": {nested}}}'
    assert_refused(tenant.raw(path, body), "max_json_depth")
    assert_twinkle_serves(state, tenant, run_id, before)


def test_json_within_the_depth_limit_is_served(limited):
    state, tenant, _, run_id = limited
    padding = {"a": {"b": {"c": {"d": [[[[1]]]]}}}}  # 9 levels with the body and args
    body = {"training_run_id": run_id, "args": {"inputs": [FEATURE]}, "padding": padding}
    assert tenant.post("/twinkle/model/forward_only", body).status_code == 200
