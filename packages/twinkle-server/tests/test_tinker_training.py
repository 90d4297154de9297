"""The Tinker training routes in process, spoken as SDK 0.16.1's JSON (no SDK needed here;
the real SDK runs against a server process in twinkle-kit's tests/tinker/).

Checked here: the datum-to-batch alignment (a returned logprob is exactly
log_softmax(model(t))[i, y[i]]), seq_id ordering and resubmits through the routes, the
retrieve_future long-poll (try_again), its content negotiation, and lowercase error
categories.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from twinkle.server.tinker import futures_route, proto_schema
from twinkle.server.tinker.results import PROTO_MEDIA_TYPE
from twinkle.server.tinker.training import tokenizer_id

TOKENS = [5, 9, 17, 33, 2, 40]
TARGETS = [9, 17, 33, 2, 40, 7]


def tensor(values, dtype):
    return {"data": list(values), "dtype": dtype}


def fwd_body(model_id, seq_id, tokens=TOKENS, targets=TARGETS, forward=False, weights=None):
    weights = weights if weights is not None else [1.0] * len(targets)
    payload = {
        "data": [
            {
                "model_input": {"chunks": [{"tokens": tokens}]},
                "loss_fn_inputs": {
                    "target_tokens": tensor(targets, "int64"),
                    "weights": tensor(weights, "float32"),
                },
            }
        ],
        "loss_fn": "cross_entropy",
    }
    key = "forward_input" if forward else "forward_backward_input"
    return {key: payload, "model_id": model_id, "seq_id": seq_id}


class TinkerTenant:
    def __init__(self, tenant, state):
        self.t, self.state = tenant, state
        self.models = 0
        self.model_id: str | None = None
        self.seq = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def create_model(self, rank=4) -> str:
        body = {
            "session_id": self.t.session,
            "model_seq_id": self.models,
            "base_model": "bundled://tiny-qwen3",
            "lora_config": {"rank": rank},
        }
        self.models += 1
        submitted = self.t.post("/create_model", body)
        assert submitted.status_code == 200, submitted.text
        result = self.retrieve(submitted.json()["request_id"])
        assert result.json()["model_id"] == submitted.json()["model_id"]
        return submitted.json()["model_id"]

    def retrieve(self, request_id, accept="application/json"):
        response = self.t.http.post(
            "/api/v1/retrieve_future",
            json={"request_id": request_id},
            headers={**self.t.headers, "Accept": accept},
        )
        assert response.status_code == 200, response.text
        return response

    def submit(self, path, body) -> str:
        response = self.t.post(path, body)
        assert response.status_code == 200, response.text
        return response.json()["request_id"]

    def logprobs(self, request_id) -> np.ndarray:
        body = self.retrieve(request_id).json()
        assert "error" not in body, body
        return np.asarray(body["loss_fn_outputs"][0]["logprobs"]["data"], dtype=np.float32)


@pytest.fixture(scope="module")
def tinker(server, make_tenant):
    """One tenant with one Tinker model (the fixture's server has 3 LoRA slots)."""
    state, http, keys = server
    tenant = TinkerTenant(make_tenant(http, keys["alice"]), state)
    tenant.model_id = tenant.create_model()
    return tenant


def test_logprobs_are_those_of_the_targets_at_each_position(tinker):
    model_id = tinker.create_model()  # fresh: its LoRA B is zero, so any adapter state works
    got = tinker.logprobs(tinker.submit("/forward", fwd_body(model_id, 1, forward=True)))
    service = tinker.state.model
    live = service.live[model_id]
    peft_model = service.model.model
    peft_model.set_adapter(live.adapter)
    peft_model.eval()
    with torch.no_grad():
        logits = peft_model(input_ids=torch.tensor([TOKENS])).logits[0].float()
    expected = torch.log_softmax(logits, -1)[torch.arange(len(TOKENS)), torch.tensor(TARGETS)]
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-5)


def test_requests_run_in_seq_id_order_whatever_the_arrival(tinker):
    """seq 1 forward_backward, 2 optim_step, 3 forward, sent 3, 2, 1: the forward sees the
    stepped weights, the forward_backward the initial ones."""
    model_id, s = tinker.model_id, tinker.seq
    tinker.seq += 4
    before = tinker.logprobs(tinker.submit("/forward", fwd_body(model_id, s + 1, forward=True)))
    adam = {"model_id": model_id, "seq_id": s + 3, "adam_params": {"learning_rate": 0.05}}
    third = tinker.submit("/forward", fwd_body(model_id, s + 4, forward=True))
    second = tinker.submit("/optim_step", adam)
    first = tinker.submit("/forward_backward", fwd_body(model_id, s + 2))
    np.testing.assert_allclose(tinker.logprobs(first), before, atol=1e-6)
    assert "error" not in tinker.retrieve(second).json()
    after = tinker.logprobs(third)
    assert np.abs(after - before).max() > 1e-3


def test_a_resubmitted_seq_id_returns_the_first_future(tinker):
    model_id, seq = tinker.model_id, tinker.next_seq()
    first = tinker.submit("/forward", fwd_body(model_id, seq, forward=True))
    again = tinker.submit("/forward", fwd_body(model_id, seq, forward=True))
    assert again == first


def test_results_come_as_protobuf_when_accepted(tinker):
    body = fwd_body(tinker.model_id, tinker.next_seq(), forward=True)
    request_id = tinker.submit("/forward", body)
    response = tinker.retrieve(request_id, accept=PROTO_MEDIA_TYPE)
    assert response.headers["content-type"] == PROTO_MEDIA_TYPE
    output = proto_schema.message("ForwardBackwardOutput")()
    output.ParseFromString(response.content)
    as_json = tinker.retrieve(request_id).json()
    assert output.metrics["loss:sum"] == pytest.approx(as_json["metrics"]["loss:sum"])
    assert output.loss_fn_outputs[0].num_datums == 1


def test_pending_futures_answer_try_again_after_the_long_poll(tinker, monkeypatch):
    monkeypatch.setattr(futures_route, "LONG_POLL_S", 0.05)
    model_id, s = tinker.model_id, tinker.seq
    tinker.seq += 2
    held = tinker.submit("/forward", fwd_body(model_id, s + 2, forward=True))  # s + 1 not sent
    body = tinker.retrieve(held).json()
    assert body == {"type": "try_again", "request_id": held, "queue_state": "active"}
    tinker.submit("/forward", fwd_body(model_id, s + 1, forward=True))
    monkeypatch.setattr(futures_route, "LONG_POLL_S", 60.0)
    assert tinker.logprobs(held).shape == (len(TOKENS),)


def test_failures_carry_a_lowercase_category(tinker):
    save = {"model_id": tinker.model_id, "path": "twice", "seq_id": tinker.next_seq()}
    assert "path" in tinker.retrieve(tinker.submit("/save_weights", save)).json()
    again = {**save, "seq_id": tinker.next_seq()}
    again = tinker.retrieve(tinker.submit("/save_weights", again)).json()
    assert again["category"] == "user" and "exists" in again["error"], again


def test_bad_requests_are_4xx_with_a_json_body_and_free_their_seq_id(tinker):
    model_id, s = tinker.model_id, tinker.seq
    tinker.seq += 2
    bad = fwd_body(model_id, s + 1, targets=TARGETS[:-1])  # one target short
    response = tinker.t.post("/forward_backward", bad)
    assert response.status_code == 400
    assert response.json()["category"] == "user"
    assert "target_tokens" in response.json()["error"]
    # the next seq_id does not wait for the rejected one
    assert tinker.logprobs(tinker.submit("/forward", fwd_body(model_id, s + 2, forward=True))).size


def test_a_misspelt_loss_fn_input_is_a_400_naming_the_closest_one(tinker):
    model_id, s = tinker.model_id, tinker.seq
    tinker.seq += 2
    bad = fwd_body(model_id, s + 1)
    datum = bad["forward_backward_input"]["data"][0]["loss_fn_inputs"]
    datum["weight"] = datum.pop("weights")
    response = tinker.t.post("/forward_backward", bad)
    assert response.status_code == 400, response.text
    assert response.json()["category"] == "user"
    assert response.json()["error"] == (
        "loss_fn_inputs 'weight' (did you mean 'weights'?) not read by 'cross_entropy': it "
        "takes target_tokens and weights"
    )
    assert tinker.logprobs(tinker.submit("/forward", fwd_body(model_id, s + 2, forward=True))).size


def test_another_key_cannot_free_a_tenants_seq_id(tinker, server, make_tenant, monkeypatch):
    """Bob's rejected request naming Alice's model and her next seq_id must not move her
    sequence: her later request still waits for her own."""
    monkeypatch.setattr(futures_route, "LONG_POLL_S", 0.05)
    _, http, keys = server
    bob = make_tenant(http, keys["bob"])
    model_id, s = tinker.model_id, tinker.seq
    tinker.seq += 2
    rejected = bob.post("/optim_step", {"model_id": model_id, "seq_id": s + 1, "adam_params": {}})
    assert rejected.status_code == 404, rejected.text
    held = tinker.submit("/forward", fwd_body(model_id, s + 2, forward=True))
    assert tinker.retrieve(held).json()["type"] == "try_again"
    tinker.submit("/forward", fwd_body(model_id, s + 1, forward=True))
    monkeypatch.setattr(futures_route, "LONG_POLL_S", 60.0)
    assert tinker.logprobs(held).shape == (len(TOKENS),)


def test_the_step_applies_the_gradient_of_the_sum(tinker):
    """Tinker losses are sums and the step does not divide them: the gradient norm (before
    a clip that never bites) doubles for a datum given twice, in one call or in two."""
    model_id = tinker.model_id

    def grad_norm(*calls) -> float:
        for datums in calls:
            body = fwd_body(model_id, tinker.next_seq())
            body["forward_backward_input"]["data"] *= datums
            assert "error" not in tinker.retrieve(tinker.submit("/forward_backward", body)).json()
        adam = {"learning_rate": 1e-12, "grad_clip_norm": 1e9}  # the weights barely move
        step = {"model_id": model_id, "seq_id": tinker.next_seq(), "adam_params": adam}
        return tinker.retrieve(tinker.submit("/optim_step", step)).json()["metrics"][
            "grad_norm:mean"
        ]

    once = grad_norm(1)
    assert grad_norm(2) == pytest.approx(2 * once, rel=1e-4)
    assert grad_norm(1, 1) == pytest.approx(2 * once, rel=1e-4)


def test_publish_and_ttl_work_through_the_tinker_routes(tinker):
    base = f"/api/v1/training_runs/{tinker.model_id}/checkpoints/weights/twice"
    http, headers = tinker.t.http, tinker.t.headers
    for response in (
        http.post(f"{base}/publish", headers=headers),
        http.delete(f"{base}/publish", headers=headers),
        http.put(f"{base}/ttl", json={"ttl_seconds": 3600}, headers=headers),
        http.put(f"{base}/ttl", json={"ttl_seconds": None}, headers=headers),
    ):
        assert response.status_code == 200, response.text
    refused = http.put(f"{base}/ttl", json={"ttl_seconds": 0}, headers=headers)
    assert refused.status_code == 400 and refused.json()["category"] == "user"
    assert "limits.max_checkpoint_ttl_s" in refused.json()["error"]


def test_tokenizer_id_is_a_hub_repo_id_when_the_model_came_from_a_hub():
    folder = "/srv/models/tiny"
    assert tokenizer_id("ms://Qwen/Qwen3-4B", folder) == "Qwen/Qwen3-4B"
    assert tokenizer_id("hf://org/name@v1", None) == "org/name"
    assert tokenizer_id("bundled://tiny-qwen3", folder) == folder
