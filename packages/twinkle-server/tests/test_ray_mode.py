"""``mode: ray``: the same routes, with the model and the sampler built on the workers of
their own Ray device groups, and the operator's pinned plugins loaded on those workers. The
model has two copies (two groups, each with its own slots and worker thread): runs on
different copies train at the same time, and a checkpoint saved on one loads on the other."""

from __future__ import annotations

import json
import os
import threading

import pytest
from fastapi.testclient import TestClient

from twinkle.server.app import create_app
from twinkle.server.auth import create_key
from twinkle.server.config import AllowList, ServerConfig
from twinkle.server.state import build_state

MODEL_ID = "bundled://tiny-qwen3"
FEATURE = {"input_ids": [1, 2, 3, 4, 5, 6], "labels": [-100, -100, 3, 4, 5, 6]}
PROMPTS = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in (1, 2)]
PARAMS = {"max_tokens": 6, "seed": 3, "logprobs": 1}
LOGPROB_TOLERANCE = 1e-5  # the same kernels on the same CPU: equal up to float rounding
# A hub plugin in an offline Hugging Face cache: loading its code needs consent, which the
# workers only have through the server's pins.
PLUGIN_REPO, PLUGIN_COMMIT = "hf://org/ray-plugin", "0123456789abcdef0123456789abcdef01234567"
PLUGIN = """
from twinkle.loss import CrossEntropyLoss


class DoubledLoss(CrossEntropyLoss):
    def __call__(self, inputs, outputs, **kwargs):
        result = super().__call__(inputs, outputs, **kwargs)
        return {**result, "loss": 2 * result["loss"]}
"""


def _hf_plugin(cache) -> str:
    """The plugin's snapshot in the cache; its sha256 for the pin."""
    from twinkle.hub.plugin import plugin_sha256

    repo = cache / "models--org--ray-plugin"
    snapshot = repo / "snapshots" / PLUGIN_COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "doubled.py").write_text(PLUGIN)
    manifest = {"module": "doubled.py", "components": ["DoubledLoss"]}
    (snapshot / "twinkle_plugin.json").write_text(json.dumps(manifest))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(PLUGIN_COMMIT)
    return plugin_sha256(snapshot)


def test_ray_mode_needs_the_groups_it_places_components_on(tmp_path):
    with pytest.raises(ValueError, match="model"):
        ServerConfig.model_validate({"mode": "ray", "sampler": {"enabled": False}})


@pytest.fixture(scope="module")
def ray_server(tmp_path_factory):
    import ray

    from twinkle.infra import reset
    from twinkle.infra.ray import runtime as ray_runtime

    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["PYTHONDONTWRITEBYTECODE"] = ""
    hf_cache = tmp_path_factory.mktemp("hf")
    sha256 = _hf_plugin(hf_cache)
    # set before ray.init: the workers take the driver's environment (restored at the end)
    hub_env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hf_cache)}
    saved = {n: os.environ.get(n) for n in [*hub_env, "TWINKLE_TRUST_REMOTE_CODE"]}
    os.environ.update(hub_env)
    os.environ.pop("TWINKLE_TRUST_REMOTE_CODE", None)
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
            "model": {
                "model_id": MODEL_ID,
                "max_loras": 5,
                "device": "cpu",
                "remote_group": ["model", "model-b"],
            },
            "limits": {"max_loras_per_key": 10},  # one key runs every test's adapters
            "sampler": {"enabled": True, "kind": "torch"},
            "device_groups": [
                {"name": "model", "ranks": 1, "device_type": "cpu"},
                {"name": "model-b", "ranks": 1, "device_type": "cpu"},
                {"name": "sampler", "ranks": 1, "device_type": "cpu"},
            ],
            "storage": {"home": str(home)},
            "allow": {
                "losses": [*AllowList().losses, f"{PLUGIN_REPO}:DoubledLoss"],
                "plugins": [{"id": PLUGIN_REPO, "revision": PLUGIN_COMMIT, "sha256": sha256}],
            },
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
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_training_saving_and_loading_through_a_ray_worker(ray_server):
    state, http, headers = ray_server
    copies = state.model.model.models
    assert len(copies) == 2
    assert all(type(c).__name__ != "MultiLoraTransformersModel" for c in copies)  # remote
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
    assert _copy_of(state, fresh) != _copy_of(state, run)  # the copy with fewer runs
    ok(fresh, "load", path=path)
    assert ok(fresh, "forward_only", inputs=[FEATURE])["loss"] == pytest.approx(saved, abs=1e-6)
    capacity = http.get("/api/v1/capacity", headers=headers).json()
    assert capacity["used_loras"] == 2 and capacity["max_loras"] == 10  # both copies' slots


def _copy_of(state, run_id: str) -> int:
    return state.model.model.holder(state.model.live[run_id].adapter)


def _copy_of_adapter(state, live) -> int:
    return state.model.model.holder(live.adapter)


def _replica_metrics(http) -> dict[tuple, float]:
    """The per-copy gauges of /metrics: (name, replica[, state]) -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    answer = http.get("/metrics")
    assert answer.status_code == 200, answer.text
    return {
        (
            s.name,
            s.labels["replica"],
            *([s.labels["state"]] if "state" in s.labels else []),
        ): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
        if s.name.startswith("twinkle_replica")
    }


def test_runs_on_different_copies_train_at_the_same_time(ray_server):
    """While one copy's worker is held, a run on the other copy trains and answers; the held
    copy's run answers once its worker is free, and both runs' losses fall."""
    state, http, headers = ray_server
    session = http.post("/api/v1/create_session", json={}, headers=headers).json()["session_id"]
    runs: dict[int, str] = {}
    while len(runs) < 2:  # a new run goes to the copy with fewer runs: both within three
        body = {"session_id": session, "config": {"r": 4}}
        added = http.post("/api/v1/twinkle/model/add_adapter_to_model", json=body, headers=headers)
        assert added.status_code == 200, added.text
        run = added.json()["result"]["training_run_id"]
        runs.setdefault(_copy_of(state, run), run)

    def call(run: str, method: str, **args):
        body = {"training_run_id": run, "args": args}
        return http.post(f"/api/v1/twinkle/model/{method}", json=body, headers=headers)

    for run in runs.values():
        assert call(run, "set_optimizer", optimizer_cls="AdamW", lr=1e-2).status_code == 200
    gate = threading.Event()
    state.model.worker.workers[0].submit("hold", gate.wait)
    held: dict[str, object] = {}
    waiting = threading.Thread(
        target=lambda: held.update(answer=call(runs[0], "forward_backward", inputs=[FEATURE]))
    )
    waiting.start()
    try:
        losses = []
        for _ in range(3):  # the other copy trains while copy 0 is held
            answer = call(runs[1], "forward_backward", inputs=[FEATURE])
            assert answer.status_code == 200, answer.text
            losses.append(answer.json()["result"]["loss"])
            assert call(runs[1], "step").status_code == 200
            assert call(runs[1], "zero_grad").status_code == 200
        assert losses[-1] < losses[0]
        assert "answer" not in held and waiting.is_alive()
        per_copy = _replica_metrics(http)  # copy 0 busy with its run's call waiting, 1 idle
        assert per_copy[("twinkle_replica_busy", "0")] == 1
        assert per_copy[("twinkle_replica_queue_depth", "0")] == 1
        assert per_copy[("twinkle_replica_busy", "1")] == 0
        assert per_copy[("twinkle_replica_queue_depth", "1")] == 0
        for replica in ("0", "1"):
            used = sum(
                1 for r in state.model.live.values() if str(_copy_of_adapter(state, r)) == replica
            )
            assert per_copy[("twinkle_replica_lora_slots", replica, "used")] == used >= 1
            assert per_copy[("twinkle_replica_lora_slots", replica, "free")] == 5 - used
    finally:
        gate.set()
    waiting.join(timeout=120)
    assert held["answer"].status_code == 200, held["answer"].text


def _sequences(responses) -> list[dict]:
    return [seq for response in responses for seq in response["sequences"]]


def _assert_same_samples(remote: list[dict], local: list[dict]) -> None:
    assert [s["tokens"] for s in remote] == [s["tokens"] for s in local]
    for r, loc in zip(remote, local, strict=True):
        remote_logps = [pairs[0][1] for pairs in r["logprobs"]]
        local_logps = [pairs[0][1] for pairs in loc["logprobs"]]
        assert remote_logps == pytest.approx(local_logps, abs=LOGPROB_TOLERANCE)


def test_sampling_on_the_sampler_group_equals_sampling_in_process(ray_server):
    from safetensors.torch import load_file

    from twinkle.sampler import TorchSampler

    state, http, headers = ray_server
    assert type(state.sampler.sampler).__name__ != "TorchSampler"  # a remote proxy

    def sample(**extra) -> list[dict]:
        body = {"inputs": PROMPTS, "sampling_params": PARAMS, **extra}
        response = http.post("/api/v1/twinkle/sampler/sample", json=body, headers=headers)
        assert response.status_code == 200, response.text
        return response.json()["result"]["sequences"]

    # A tuned adapter, saved: the sampler worker loads it from its checkpoint.
    session = http.post("/api/v1/create_session", json={}, headers=headers).json()["session_id"]
    body = {"session_id": session, "config": {"r": 4}}
    added = http.post("/api/v1/twinkle/model/add_adapter_to_model", json=body, headers=headers)
    run = added.json()["result"]["training_run_id"]
    for method, args in (
        ("set_optimizer", {"optimizer_cls": "AdamW", "lr": 5e-2}),
        ("forward_backward", {"inputs": [FEATURE]}),
        ("step", {}),
        ("save", {"name": "for-sampler"}),
    ):
        body = {"training_run_id": run, "args": args}
        response = http.post(f"/api/v1/twinkle/model/{method}", json=body, headers=headers)
        assert response.status_code == 200, response.text
    uri = response.json()["result"]
    (folder,) = state.home.glob("checkpoints/*/*/weights/for-sampler")

    local = TorchSampler(MODEL_ID, device="cpu", seed=state.config.model.seed)
    local.set_template("Template")
    base = _sequences(r.to_dict() for r in local.sample(PROMPTS, PARAMS))
    config = json.loads((folder / "adapter_config.json").read_text())
    local.load_lora("tuned", config, load_file(str(folder / "adapter_model.safetensors")))
    tuned = _sequences(r.to_dict() for r in local.sample(PROMPTS, PARAMS, adapter_name="tuned"))

    _assert_same_samples(sample(), base)
    _assert_same_samples(sample(adapter_uri=uri), tuned)
    base_logps = [pairs[0][1] for pairs in base[0]["logprobs"]]
    tuned_logps = [pairs[0][1] for pairs in tuned[0]["logprobs"]]
    assert base_logps != pytest.approx(tuned_logps, abs=1e-3)  # the adapter really applies


def test_a_bad_loss_input_on_a_ray_worker_is_a_400_naming_it(ray_server):
    """The worker's ValueError reaches the caller as a 400 with its message (not the worker's
    traceback), and the run keeps training."""
    state, http, headers = ray_server
    session = http.post("/api/v1/create_session", json={}, headers=headers).json()["session_id"]
    body = {"session_id": session, "config": {"r": 4}}
    added = http.post("/api/v1/twinkle/model/add_adapter_to_model", json=body, headers=headers)
    run = added.json()["result"]["training_run_id"]

    def call(method: str, **args):
        body = {"training_run_id": run, "args": args}
        return http.post(f"/api/v1/twinkle/model/{method}", json=body, headers=headers)

    assert call("set_loss", loss="GRPOLoss").status_code == 200
    bad = call("forward_backward", inputs=[FEATURE], advantages=[1.0], old_logps=[[-1.0] * 3])
    assert bad.status_code == 400, bad.text
    assert "old_logps[0] has 3 values but row 0 of the batch has 4 label tokens" in bad.text
    assert "Traceback" not in bad.text and "worker rank" not in bad.text
    typo = call("forward_backward", inputs=[FEATURE], advantage=[1.0])  # refused on the worker
    assert typo.status_code == 400, typo.text
    assert "unknown keyword 'advantage' (did you mean 'advantages'?)" in typo.text
    good = call("forward_backward", inputs=[FEATURE], advantages=[1.0], old_logps=[[-1.0] * 4])
    assert good.status_code == 200, good.text


def test_a_pinned_plugin_loss_runs_on_the_ray_worker(ray_server):
    """The worker resolves the tenant's plugin loss from the pins the server loaded there:
    without them it would have to load hub code it has no consent for."""
    _, http, headers = ray_server
    session = http.post("/api/v1/create_session", json={}, headers=headers).json()["session_id"]
    body = {"session_id": session, "config": {"r": 4}}
    added = http.post("/api/v1/twinkle/model/add_adapter_to_model", json=body, headers=headers)
    run = added.json()["result"]["training_run_id"]

    def loss_with(loss: str) -> float:
        body = {"training_run_id": run, "args": {"loss": loss}}
        chosen = http.post("/api/v1/twinkle/model/set_loss", json=body, headers=headers)
        assert chosen.status_code == 200, chosen.text
        body = {"training_run_id": run, "args": {"inputs": [FEATURE]}}
        answer = http.post("/api/v1/twinkle/model/forward_only", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        return answer.json()["result"]["loss"]

    plain = loss_with("CrossEntropyLoss")
    assert loss_with(f"{PLUGIN_REPO}:DoubledLoss") == pytest.approx(2 * plain, rel=1e-5)


def test_a_stream_from_the_sampler_group_hears_tokens_while_the_worker_draws(
    ray_server, monkeypatch
):
    """The OpenAI stream of a TorchSampler on its Ray group: each token is relayed while the
    remote call still runs (not chunks made after it), and the pieces add up to the whole
    answer of the same seed."""
    from twinkle.server.openai.live_stream import LiveStream

    state, http, headers = ray_server
    assert state.sampler.streams_tokens
    heard: list[bool] = []  # per token: whether the remote call was still running
    listener = LiveStream.listener

    def recording(self, prompt):
        heard_token = listener(self, prompt)

        def heard_while_running(row, token, pairs):
            heard.append(state.sampler._relay.in_flight)
            heard_token(row, token, pairs)

        return heard_while_running

    monkeypatch.setattr(LiveStream, "listener", recording)
    body = {"model": MODEL_ID, "prompt": [5, 17, 42], "max_tokens": 10, "seed": 2}
    auth = {"Authorization": f"Bearer {headers['X-API-Key']}"}
    whole = http.post("/v1/completions", json=body, headers=auth)
    assert whole.status_code == 200, whole.text
    streamed = http.post("/v1/completions", json={**body, "stream": True}, headers=auth)
    assert streamed.status_code == 200, streamed.text
    events = [line[6:] for line in streamed.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])
    assert text == whole.json()["choices"][0]["text"]
    assert len(heard) == whole.json()["usage"]["completion_tokens"] > 1
    assert heard[0]  # the first token reached the stream before the remote call returned
