"""The Tinker SDK trains against a server in ``mode: ray`` and ``mode: http`` (Ray Serve):
the model lives on a one-worker CPU Ray group, and every Tinker operation reaches it through
the model's remote functions (the summed-gradient step is its ``step_with``).

Each mode is a server process of its own (it owns its Ray cluster), started by the
``server_process`` fixture; the sampler is off, since this checks the training path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

LR = 5e-3
SEQUENCES = [
    [11, 12, 13, 14, 15, 16, 17, 18],
    [21, 22, 23, 24, 25, 26],
    [31, 32, 33, 34, 35, 36, 37],
]


def _datum(tokens: list[int]) -> types.Datum:
    targets = tokens[1:]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": np.asarray(targets, dtype=np.int64),
            "weights": np.ones(len(targets), dtype=np.float32),
        },
    )


DATA = [_datum(s) for s in SEQUENCES]


@pytest.fixture(scope="module", params=["ray", "http"])
def ray_server(request, server_process, base_model) -> Iterator[tuple[str, str, Path]]:
    server = server_process(
        "tinker_ray_home",
        {
            "mode": request.param,
            "model": {"model_id": base_model, "max_loras": 4, "device": "cpu"},
            "sampler": {"enabled": False},
            "device_groups": [{"name": "model", "ranks": 1, "device_type": "cpu"}],
            "ray_init_kwargs": {"num_cpus": 3, "include_dashboard": False},
        },
        ray=True,
    )
    key = server.cli("keys", "create", "--name", "ray")
    server.start(timeout_s=240)
    if request.param == "http":  # answered through Serve's proxy, not uvicorn alone
        assert "x-request-id" in httpx.get(f"{server.url}/api/v1/healthz", timeout=10).headers
    yield server.url, key, Path(server.ray_dir.name)
    server.stop(timeout_s=60)


def _train_step(client) -> tuple[float, types.ForwardBackwardOutput]:
    fwdbwd = client.forward_backward(DATA, "cross_entropy")
    optim = client.optim_step(types.AdamParams(learning_rate=LR, grad_clip_norm=10.0))
    result = fwdbwd.result(timeout=120)
    metrics = optim.result(timeout=120).metrics
    assert metrics["grad_norm:mean"] > 0  # clipping ran on the worker and reported the norm
    return result.metrics["loss:sum"], result


def test_sl_loop_and_resume_on_a_ray_worker(ray_server, base_model):
    url, key, ray_dir = ray_server
    assert list(ray_dir.glob("ray/session_*")), "the server started no Ray cluster"
    with tinker.ServiceClient(base_url=url, api_key=key) as service:
        client = service.create_lora_training_client(base_model=base_model, rank=8, seed=0)
        client = client.result(timeout=120)
        losses = []
        for _ in range(4):
            loss, result = _train_step(client)
            losses.append(loss)
        # The step applies the gradient of the SUM: loss:sum is -sum(logprobs), and it falls.
        logprobs = np.concatenate([o["logprobs"].to_numpy() for o in result.loss_fn_outputs])
        assert loss == pytest.approx(-logprobs.sum(), rel=1e-4)
        assert losses[-1] < 0.9 * losses[0], losses

        path = client.save_state("ray-resume").result(timeout=120).path
        assert path == f"tinker://{client.model_id}/weights/ray-resume"
        # the worker saves, the server exports what it wrote: a peft folder behind signed URLs
        export = client.save_weights_external("ray-export").result(timeout=120).path
        urls = tinker.RestClient(base_url=url, api_key=key).get_external_weights_urls(export)
        files = {
            n: httpx.get(u, timeout=30).content for n, u in urls.result(timeout=120).urls.items()
        }
        assert json.loads(files["adapter_config.json"])["r"] == 8
        assert len(files["adapter_model.safetensors"]) > 0
        resumed = service.create_training_client_from_state_with_optimizer(path)
        resumed = resumed.result(timeout=120)
        assert resumed.model_id != client.model_id
        original = [_train_step(client)[0] for _ in range(2)]
        again = [_train_step(resumed)[0] for _ in range(2)]
        # The same weights and Adam moments on the same worker: the same losses (1e-5).
        np.testing.assert_allclose(again, original, rtol=1e-5)
        assert original[-1] < losses[-1]
