"""Shared fixtures: one in-process server on the tiny model, and two tenants' keys."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from twinkle.server.app import create_app
from twinkle.server.auth import create_key
from twinkle.server.config import ServerConfig
from twinkle.server.state import build_state

FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}


def tiny_config(home, **limits) -> ServerConfig:
    return ServerConfig.model_validate(
        {
            "model": {
                "model_id": "bundled://tiny-qwen3",
                "max_loras": 3,
                "max_rank": 8,
                "device": "cpu",
            },
            "sampler": {"enabled": False},
            "storage": {"home": str(home)},
            "limits": {"max_body_bytes": 64 * 1024, **limits},
        }
    )


class Tenant:
    """One API key talking to the in-process app."""

    def __init__(self, http: TestClient, key: str) -> None:
        self.http, self.key = http, key
        self.headers = {"X-API-Key": key}
        self.session = self.post("/create_session", {}).json()["session_id"]

    def key_id(self) -> str:
        return self.http.app.state.twinkle.principal(self.key).key_id

    def post(self, path, body=None, **kw):
        return self.http.post(f"/api/v1{path}", json=body, headers=self.headers, **kw)

    def get(self, path, **kw):
        return self.http.get(f"/api/v1{path}", headers=self.headers, **kw)

    def delete(self, path):
        return self.http.delete(f"/api/v1{path}", headers=self.headers)

    def new_run(self, rank: int = 4) -> str:
        body = {
            "session_id": self.session,
            "adapter_name": "default",
            "config": {"r": rank, "target_modules": "all-linear"},
        }
        response = self.post("/twinkle/model/add_adapter_to_model", body)
        assert response.status_code == 200, response.text
        return response.json()["result"]["training_run_id"]

    def call(self, run_id: str, method: str, **args):
        return self.post(f"/twinkle/model/{method}", {"training_run_id": run_id, "args": args})

    def ok(self, run_id: str, method: str, **args):
        response = self.call(run_id, method, **args)
        assert response.status_code == 200, response.text
        return response.json()["result"]


@pytest.fixture(scope="session")
def make_tenant():
    return Tenant


@pytest.fixture(scope="session")
def feature():
    return FEATURE


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    state = build_state(tiny_config(home))
    keys = {name: create_key(state.store, name)[0] for name in ("alice", "bob", "mallory")}
    with TestClient(create_app(state), raise_server_exceptions=False) as http:
        yield state, http, keys
    state.close()
