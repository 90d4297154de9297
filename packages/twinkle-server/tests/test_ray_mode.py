"""``mode: ray``: the same routes, with the model built on a Ray device group's worker."""

from __future__ import annotations

import os

import pytest
from fastapi.testclient import TestClient

from twinkle.server.app import create_app
from twinkle.server.auth import create_key
from twinkle.server.config import ServerConfig
from twinkle.server.state import build_state

FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}


def test_ray_mode_needs_the_groups_it_places_components_on(tmp_path):
    with pytest.raises(ValueError, match="model"):
        ServerConfig.model_validate({"mode": "ray", "sampler": {"enabled": False}})


@pytest.fixture(scope="module")
def ray_server(tmp_path_factory):
    import ray

    from twinkle.infra import ray_runtime, reset

    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["PYTHONDONTWRITEBYTECODE"] = ""
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
    )
    home = tmp_path_factory.mktemp("home")
    config = ServerConfig.model_validate(
        {
            "mode": "ray",
            "model": {"model_id": "bundled://tiny-qwen3", "max_loras": 2, "device": "cpu"},
            "sampler": {"enabled": False},
            "device_groups": [{"name": "model", "ranks": 1, "device_type": "cpu"}],
            "storage": {"home": str(home)},
        }
    )
    state = build_state(config)
    key = create_key(state.store, "alice")[0]
    try:
        with TestClient(create_app(state), raise_server_exceptions=False) as http:
            yield state, http, {"X-API-Key": key}
    finally:
        state.close()
        ray_runtime.shutdown()
        reset()
        ray.shutdown()


def test_training_saving_and_loading_through_a_ray_worker(ray_server):
    state, http, headers = ray_server
    assert type(state.model.model).__name__ != "MultiLoraTransformersModel"  # a remote proxy
    session = http.post("/api/v1/create_session", json={}, headers=headers).json()["session_id"]

    def new_run() -> str:
        body = {"session_id": session, "config": {"r": 4}}
        response = http.post(
            "/api/v1/twinkle/model/add_adapter_to_model", json=body, headers=headers
        )
        assert response.status_code == 200, response.text
        return response.json()["result"]["training_run_id"]

    def ok(run: str, method: str, **args):
        body = {"training_run_id": run, "args": args}
        response = http.post(f"/api/v1/twinkle/model/{method}", json=body, headers=headers)
        assert response.status_code == 200, response.text
        return response.json()["result"]

    run = new_run()
    ok(run, "set_optimizer", optimizer_cls="AdamW", lr=1e-2)
    ok(run, "set_processor", processor="InputProcessor", padding_side="right")
    losses = []
    for _ in range(3):
        losses.append(ok(run, "forward_backward", inputs=[FEATURE])["loss"])
        ok(run, "step")
        ok(run, "zero_grad")
    assert losses[-1] < losses[0]
    path = ok(run, "save", name="on-ray")
    saved = ok(run, "forward_only", inputs=[FEATURE])["loss"]
    fresh = new_run()
    ok(fresh, "load", path=path)
    assert ok(fresh, "forward_only", inputs=[FEATURE])["loss"] == pytest.approx(saved, abs=1e-6)
    assert http.get("/api/v1/capacity", headers=headers).json()["used_loras"] == 2
