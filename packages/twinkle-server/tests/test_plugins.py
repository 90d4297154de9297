"""The operator's plugin allow-list: a tenant uses a pinned plugin's loss and preprocessor,
and is refused (403, naming the allow-list) any component the operator did not list.

The plugin repo is a local mirror of the Hugging Face cache layout, offline.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from twinkle.hub.plugin import plugin_sha256
from twinkle.server.app import create_app
from twinkle.server.auth import create_key
from twinkle.server.config import AllowList, ServerConfig, check_allow_lists
from twinkle.server.state import build_state

COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
REPO = "hf://org/tenant-plugin"
PLUGIN = '''
from twinkle.loss import CrossEntropyLoss
from twinkle.preprocessor import Preprocessor


class DoubledLoss(CrossEntropyLoss):
    """Cross entropy counted twice: a loss of the tenant's own, easy to check."""

    def __call__(self, inputs, outputs, **kwargs):
        result = super().__call__(inputs, outputs, **kwargs)
        return {**result, "loss": 2 * result["loss"]}


class ShoutProcessor(Preprocessor):
    def __call__(self, row):
        return {"messages": [
            {"role": "user", "content": row["query"].upper()},
            {"role": "assistant", "content": row["response"]},
        ]}


class NotListed(CrossEntropyLoss):
    pass
'''
FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}


def hf_plugin(cache: Path) -> Path:
    repo = cache / "models--org--tenant-plugin"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "tenant.py").write_text(PLUGIN)
    components = ["DoubledLoss", "ShoutProcessor", "NotListed"]
    (snapshot / "twinkle_plugin.json").write_text(
        json.dumps({"module": "tenant.py", "components": components})
    )
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """An offline hub whose cache holds the plugin; the environment gives no consent."""
    cache = tmp_path_factory.mktemp("hf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TWINKLE_HUB_OFFLINE", "1")
        patch.setenv("HF_HUB_CACHE", str(cache))
        patch.delenv("TWINKLE_TRUST_REMOTE_CODE", raising=False)
        yield hf_plugin(cache)


def allow(sha256: str, **lists) -> dict:
    base = AllowList()
    return {
        "losses": [*base.losses, f"{REPO}:DoubledLoss"],
        "preprocessors": [*base.preprocessors, f"{REPO}:ShoutProcessor"],
        "plugins": [{"id": REPO, "revision": COMMIT, "sha256": sha256}],
        **lists,
    }


def config(home: Path, allowed: dict) -> ServerConfig:
    return ServerConfig.model_validate(
        {
            "model": {"model_id": "bundled://tiny-qwen3", "max_loras": 2, "device": "cpu"},
            "sampler": {"enabled": False},
            "storage": {"home": str(home)},
            "allow": allowed,
        }
    )


@pytest.fixture(scope="module")
def tenant(hub, tmp_path_factory):
    state = build_state(config(tmp_path_factory.mktemp("home"), allow(plugin_sha256(hub))))
    key = create_key(state.store, "alice")[0]
    with TestClient(create_app(state), raise_server_exceptions=False) as http:
        headers = {"X-API-Key": key}
        session = http.post("/api/v1/create_session", json={}, headers=headers).json()

        def post(path: str, body: dict):
            return http.post(f"/api/v1{path}", json=body, headers=headers)

        made = post(
            "/twinkle/model/add_adapter_to_model",
            {"session_id": session["session_id"], "config": {"r": 4}},
        )
        assert made.status_code == 200, made.text
        yield post, made.json()["result"]["training_run_id"]
    state.close()


def test_a_tenant_trains_with_an_allowed_plugin_loss(tenant):
    post, run = tenant

    def loss_with(loss: str) -> float:
        chosen = post("/twinkle/model/set_loss", {"training_run_id": run, "args": {"loss": loss}})
        assert chosen.status_code == 200, chosen.text
        body = {"training_run_id": run, "args": {"inputs": [FEATURE]}}
        answer = post("/twinkle/model/forward_only", body)
        assert answer.status_code == 200, answer.text
        return answer.json()["result"]["loss"]

    plain = loss_with("CrossEntropyLoss")
    assert plain > 0
    assert loss_with(f"{REPO}:DoubledLoss") == pytest.approx(2 * plain, rel=1e-5)


def test_a_tenant_maps_a_dataset_with_an_allowed_plugin_preprocessor(tenant):
    post, _ = tenant
    meta = {"dataset_id": "bundled://self-cognition", "data_slice": [0, 4]}
    dataset = post("/twinkle/dataset/create", {"dataset_meta": meta}).json()["result"]
    args = {"preprocessor": f"{REPO}:ShoutProcessor"}
    mapped = post("/twinkle/dataset/map", {"dataset_id": dataset, "args": args})
    assert mapped.status_code == 200, mapped.text
    assert mapped.json()["result"] == 4


@pytest.mark.parametrize(
    "loss",
    [
        f"{REPO}:NotListed",  # the pinned repo provides it; the operator did not list it
        "hf://org/elsewhere:AnyLoss",
        "/tmp/a-folder:AnyLoss",
    ],
)
def test_a_component_the_operator_did_not_list_is_a_403_naming_the_allow_list(tenant, loss):
    post, run = tenant
    answer = post("/twinkle/model/set_loss", {"training_run_id": run, "args": {"loss": loss}})
    assert answer.status_code == 403, answer.text
    message = answer.json()["error"]
    assert "does not allow" in message and f"{REPO}:DoubledLoss" in message
    assert "CrossEntropyLoss" in message


def test_a_wrong_hash_stops_the_server_from_starting(hub, tmp_path):
    with pytest.raises(ValueError, match=r"allow.plugins\[0\].*not the pinned sha256=a{64}"):
        build_state(config(tmp_path, allow("a" * 64)))


def test_a_component_of_an_unpinned_plugin_or_an_unpinned_revision_is_a_config_error(hub):
    with pytest.raises(ValidationError, match="is not pinned under allow.plugins"):
        AllowList.model_validate(allow(plugin_sha256(hub), plugins=[]))
    unpinned = [{"id": REPO, "sha256": plugin_sha256(hub)}]
    with pytest.raises(ValidationError, match="needs a revision"):
        AllowList.model_validate(allow(plugin_sha256(hub), plugins=unpinned))
    with pytest.raises(ValidationError, match="sha256"):
        AllowList.model_validate(allow("not-a-hash"))


def test_the_config_check_names_a_component_of_the_wrong_kind(hub, tmp_path):
    wrong = allow(plugin_sha256(hub))
    wrong["losses"].append(f"{REPO}:ShoutProcessor")
    problems = check_allow_lists(config(tmp_path, wrong))
    assert len(problems) == 1
    assert problems[0].startswith(f"allow.losses: '{REPO}:ShoutProcessor' is not a loss")
