"""A user's mistakes on the Twinkle model and data routes are 4xx naming what is wrong, never
a 500, and never an adapter poisoned with NaN.

Each case is sent as the raw JSON a client could write (NaN and Infinity included: Python's
JSON reader takes them) to an in-process server. After it the same client must get a normal
answer, and the adapter must be unchanged and finite. The message comes from the library
component that refused the value (``errors.as_api_error`` turns its ValueError or TypeError
into the 400), so it says what to fix.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from fastapi.testclient import TestClient

FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}
NAN = float("nan")
VOCAB = 3909  # the bundled tiny-qwen3's embedding rows
LOGPS = [-1.0, -1.25, -0.75, -1.5]  # FEATURE has four label tokens


class Tenant:
    def __init__(self, http: TestClient, key: str) -> None:
        self.http, self.headers = http, {"X-API-Key": key, "Content-Type": "application/json"}
        self.session = self.send("/create_session", "{}").json()["session_id"]

    def send(self, path: str, content: str):
        return self.http.post(f"/api/v1{path}", content=content, headers=self.headers)

    def call(self, run_id: str, method: str, args: str):
        """``args`` is the raw JSON text of the method's arguments."""
        body = f'{{"training_run_id": "{run_id}", "args": {args}}}'
        return self.send(f"/twinkle/model/{method}", body)

    def ok(self, run_id: str, method: str, **args):
        response = self.call(run_id, method, json.dumps(args))
        assert response.status_code == 200, response.text
        return response.json()["result"]

    def new_run(self, rank: int = 4) -> str:
        body = {"session_id": self.session, "config": {"r": rank}}
        response = self.send("/twinkle/model/add_adapter_to_model", json.dumps(body))
        assert response.status_code == 200, response.text
        return response.json()["result"]["training_run_id"]


@pytest.fixture(scope="module")
def mistakes(server):
    state, http, keys = server
    tenant = Tenant(http, keys["alice"])
    # A rank-8 checkpoint to load into a rank-4 run; its slot is freed (the key's quota is 2).
    rank8 = tenant.new_run(rank=8)
    saved = tenant.ok(rank8, "save", name="rank8")
    removed = tenant.send("/twinkle/model/remove_adapter", json.dumps({"training_run_id": rank8}))
    assert removed.status_code == 200, removed.text
    runs = {"ce": tenant.new_run(), "grpo": tenant.new_run(), "rank8": saved}
    tenant.ok(runs["grpo"], "set_loss", loss="GRPOLoss")
    for name in ("ce", "grpo"):  # one real step each: LoRA B non-zero, an optimizer set
        run = runs[name]
        tenant.ok(run, "set_optimizer", optimizer_cls="AdamW", lr=1e-2)
        tenant.ok(run, "forward_backward", inputs=[FEATURE], **_rl_args(name))
        tenant.ok(run, "clip_grad_and_step")
    return state, tenant, runs


def _rl_args(name: str) -> dict:
    return {"advantages": [1.0], "old_logps": [LOGPS]} if name == "grpo" else {}


def adapter_weights(state, run_id: str) -> dict[str, torch.Tensor]:
    adapter = state.model.live[run_id].adapter
    params = state.model.model.model.named_parameters()
    return {name: p.detach().clone() for name, p in params if f".{adapter}." in name}


def assert_still_serving(state, tenant: Tenant, run_id: str, name: str, before: dict) -> None:
    """A normal forward answers with a finite loss, and the refused call moved nothing."""
    loss = tenant.ok(run_id, "forward_only", inputs=[FEATURE], **_rl_args(name))["loss"]
    assert math.isfinite(loss)
    after = adapter_weights(state, run_id)
    assert after.keys() == before.keys() and before
    for param, tensor in after.items():
        assert torch.isfinite(tensor).all(), param
        assert torch.equal(tensor, before[param]), f"{param} changed"


def _feature(input_ids, labels=None) -> str:
    return json.dumps([{"input_ids": input_ids, "labels": labels or [-100] * len(input_ids)}])


MODEL_CASES = [
    # (run, method, raw args, what the message says)
    ("ce", "set_optimizer", '{"optimizer_cls": "AdamW", "lr": -1.0}', "Invalid learning rate"),
    ("ce", "set_optimizer", '{"optimizer_cls": "AdamW", "lr": Infinity}', "'lr' must be a finite"),
    ("ce", "set_optimizer", '{"optimizer_cls": "SGD", "lr": NaN}', "'lr' must be a finite"),
    ("ce", "set_optimizer", '{"weight_decay": Infinity}', "'weight_decay' must be a finite"),
    ("ce", "set_optimizer", '{"eps": NaN}', "'eps' must be a finite"),
    ("ce", "set_optimizer", '{"betas": [5.0, 0.9]}', "Invalid beta parameter"),
    ("ce", "set_optimizer", '{"lr": 0.1, "bogus": 1}', "does not accept bogus"),
    ("ce", "set_optimizer", '{"lr": "x"}', "optimizer AdamW: lr must be a number, got 'x'"),
    ("ce", "set_optimizer", '{"optimizer_cls": "torch.optim.LBFGS"}', "unknown optimizer"),
    ("ce", "set_loss", '{"loss": "CrossEntropyLoss", "bogus": 1}', "unexpected keyword"),
    ("ce", "set_loss", '{"loss": "GRPOLoss", "epsilon": NaN}', "'epsilon' must be a finite"),
    ("ce", "set_loss", '{"loss": "GRPOLoss", "epsilon": 5.0}', "epsilon must lie in (0, 1)"),
    ("ce", "set_loss", '{"loss": "os.system"}', "unknown loss"),
    ("ce", "set_lr_scheduler", '{"scheduler_cls": "LinearLR", "bogus": 1}', "bogus"),
    ("ce", "clip_grad_norm", '{"max_norm": NaN}', "max_norm"),
    ("ce", "clip_grad_norm", '{"max_norm": -1}', "max_norm"),
    ("ce", "clip_grad_and_step", '{"gradient_accumulation_steps": 0}', "positive integer"),
    (
        "ce",
        "forward_backward",
        f'{{"inputs": {_feature([1, 2, 10**6], [-100, 2, 3])}}}',
        f"input_ids row 0 holds token id 1000000, outside this model's vocabulary [0, {VOCAB})",
    ),
    (
        "ce",
        "forward_backward",
        '{"inputs": [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, '
        '{"input_ids": [1, -2, 3], "labels": [-100, 2, 3]}]}',
        "input_ids row 1 holds token id -2",
    ),
    ("ce", "forward_backward", f'{{"inputs": {_feature([1, 2, 3])}}}', "no label tokens"),
    (
        "ce",
        "forward_backward",
        f'{{"inputs": {_feature([1, 2, 3], [-100, 2, 10**6])}}}',
        "label ids must lie in",
    ),
    (
        "ce",
        "forward_backward",
        '{"inputs": [F], "micro_batch_size": 0}',
        "micro_batch_size must be",
    ),
    (
        "ce",
        "forward_backward",
        '{"inputs": [F, F], "micro_batch_size": "1"}',
        "micro_batch_size must be an int >= 1 or None, got '1'",
    ),
    ("ce", "save", '{"name": "c1", "consumed_train_samples": -5}', "consumed_train_samples"),
    ("ce", "save", '{"name": "c1", "consumed_train_samples": "x"}', "consumed_train_samples"),
    ("ce", "save", '{"name": "../../etc"}', "name"),
    ("ce", "load", '{"path": "RANK8"}', "does not match"),
    ("ce", "resume_from_checkpoint", '{"path": "RANK8"}', "does not match"),
    ("ce", "step", '{"bogus": 1}', "takes no argument"),
    # GRPO's inputs: NaN or infinite advantages and old logps never reach the loss.
    ("grpo", "forward_backward", '{"inputs": [F], "advantages": [NaN]}', "advantages[0] holds NaN"),
    ("grpo", "forward_backward", '{"inputs": [F], "advantages": [Infinity]}', "advantages[0]"),
    (
        "grpo",
        "forward_backward",
        '{"inputs": [F, F], "advantages": [1.0, -Infinity], "micro_batch_size": 1}',
        "advantages[1] holds NaN or an infinite",
    ),
    (
        "grpo",
        "forward_backward",
        '{"inputs": [F], "advantages": [1.0], "old_logps": [[-1.0, NaN, -0.5, -1.0]]}',
        "old_logps[0] holds NaN",
    ),
    (
        "grpo",
        "forward_backward",
        '{"inputs": [F], "advantages": [1.0], '
        '"old_logps": [[[[3, -1.0]], [[4, NaN]], [[5, -1.0]], [[6, -1.0]]]]}',
        "old_logps[0] holds NaN",
    ),
    (
        "grpo",
        "forward_only",
        '{"inputs": [F], "advantages": [[0, 0, 1.0, NaN, 1.0, 1.0]]}',
        "advantages[0] holds NaN",
    ),
    ("grpo", "forward_backward", '{"inputs": [F]}', "advantages"),
    # A keyword no part of the call reads is refused, not silently dropped.
    (
        "grpo",
        "forward_backward",
        '{"inputs": [F], "advantage": [1.0]}',
        "forward_backward got unknown keyword 'advantage' (did you mean 'advantages'?): "
        "nothing in the call reads it. The loss GRPOLoss accepts advantages (required), "
        "old_logps, ref_logps",
    ),
    (
        "grpo",
        "forward_only",
        '{"inputs": [F], "advantages": [1.0], "old_logp": [[-1.0, -1.0, -1.0, -1.0]]}',
        "forward_only got unknown keyword 'old_logp' (did you mean 'old_logps'?)",
    ),
    (
        "ce",
        "forward_backward",
        '{"inputs": [F], "micro_batch": 1}',
        "unknown keyword 'micro_batch' (did you mean 'micro_batch_size'?)",
    ),
    ("ce", "forward_only", '{"inputs": [F], "advantages": [1.0]}', "CrossEntropyLoss accepts no"),
]


@pytest.mark.parametrize(("run", "method", "args", "message"), MODEL_CASES)
def test_a_mistake_on_the_model_routes_is_a_4xx_and_changes_nothing(
    mistakes, run, method, args, message
):
    state, tenant, runs = mistakes
    run_id = runs[run]
    before = adapter_weights(state, run_id)
    args = args.replace('"RANK8"', json.dumps(runs["rank8"])).replace(
        "[F", f"[{json.dumps(FEATURE)}"
    )
    args = args.replace(", F]", f", {json.dumps(FEATURE)}]")
    response = tenant.call(run_id, method, args)
    assert 400 <= response.status_code < 500, response.text
    body = response.json()
    assert body["category"] == "user" and message in body["error"], body
    assert str(state.home) not in body["error"]  # server paths never leave
    assert_still_serving(state, tenant, run_id, run, before)


@pytest.fixture(scope="module")
def loader(mistakes):
    _, tenant, _ = mistakes
    meta = {"dataset_id": "bundled://self-cognition", "data_slice": [0, 8]}
    created = tenant.send("/twinkle/dataset/create", json.dumps({"dataset_meta": meta}))
    assert created.status_code == 200, created.text
    dataset_id = created.json()["result"]
    made = tenant.send(
        "/twinkle/dataloader/create",
        json.dumps({"dataset_id": dataset_id, "args": {"batch_size": 2}}),
    )
    assert made.status_code == 200, made.text
    return dataset_id, made.json()["result"]


DATA_CASES = [
    ("/twinkle/dataloader/create", "DS", {"batch_size": 0}, "batch_size must be >= 1"),
    ("/twinkle/dataloader/create", "DS", {"batch_size": -1}, "batch_size must be >= 1"),
    ("/twinkle/dataloader/create", "DS", {"batch_size": "x"}, "batch_size must be an int"),
    ("/twinkle/dataloader/create", "DS", {"batch_size": 2, "seed": "x"}, "seed"),
    ("/twinkle/dataloader/resume_from_checkpoint", "DL", {"consumed_train_samples": -3}, ">= 0"),
    ("/twinkle/dataloader/resume_from_checkpoint", "DL", {"consumed_train_samples": "x"}, "int"),
    (
        "/twinkle/dataset/map",
        "DS",
        {"preprocessor": "SelfCognitionProcessor", "init_args": {"bogus": 1}},
        "unexpected keyword argument 'bogus'",
    ),
    ("/twinkle/dataset/encode", "DS", {}, "has no template: call set_template"),
    ("/twinkle/dataset/set_template", "DS", {"template": "Template", "max_length": NAN}, "finite"),
]


@pytest.mark.parametrize(("path", "owner", "args", "message"), DATA_CASES)
def test_a_mistake_on_the_data_routes_is_a_4xx(mistakes, loader, path, owner, args, message):
    state, tenant, runs = mistakes
    dataset_id, loader_id = loader
    before = adapter_weights(state, runs["ce"])
    target = {"dataset_id": dataset_id} if owner == "DS" else {"dataloader_id": loader_id}
    response = tenant.send(path, json.dumps({**target, "args": args}))
    assert 400 <= response.status_code < 500, response.text
    body = response.json()
    assert body["category"] == "user" and message in body["error"], body
    batch = tenant.send("/twinkle/dataloader/next", json.dumps({"dataloader_id": loader_id}))
    assert batch.status_code == 200, batch.text  # the data routes still serve
    assert_still_serving(state, tenant, runs["ce"], "ce", before)
