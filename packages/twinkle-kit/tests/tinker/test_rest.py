"""The SDK's RestClient against the server: runs, checkpoints, weights info, deletion, sessions.

One training client saves two training checkpoints and one sampler checkpoint; the REST
calls must describe exactly those, and the same run must be visible to the Twinkle client
(an SDK run and a Twinkle run are the same records).
"""

from __future__ import annotations

import httpx
import pytest
import tinker
from tinker import types

from twinkle_client import TwinkleClient

TIMEOUT_S = 120
RANK = 4


def _datum(tokens: list[int]) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(
                data=tokens[1:], dtype="int64", shape=[len(tokens) - 1]
            ),
            "weights": types.TensorData(
                data=[1.0] * (len(tokens) - 1), dtype="float32", shape=[len(tokens) - 1]
            ),
        },
    )


@pytest.fixture(scope="module")
def trained(tinker_server, base_model):
    """A run with checkpoints weights/r1, weights/r2 and sampler_weights/s1."""
    service = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.key_a)
    training = service.create_lora_training_client(base_model=base_model, rank=RANK)
    training = training.result(TIMEOUT_S)
    training.forward_backward([_datum([1, 2, 3, 4, 5, 6])], "cross_entropy").result(TIMEOUT_S)
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result(TIMEOUT_S)
    paths = {
        "weights/r1": training.save_state("r1").result(TIMEOUT_S).path,
        "weights/r2": training.save_state("r2").result(TIMEOUT_S).path,
        "sampler_weights/s1": training.save_weights_for_sampler("s1").result(TIMEOUT_S).path,
    }
    yield {
        "service": service,
        "rest": tinker.RestClient(base_url=tinker_server.base_url, api_key=tinker_server.key_a),
        "run_id": training.model_id,
        "paths": paths,
    }
    service.close("success").result(TIMEOUT_S)


def test_save_paths_are_tinker_paths_of_the_run(trained):
    run_id = trained["run_id"]
    assert run_id.split(":")[-2:] == ["train", "0"], run_id  # "{session_id}:train:{seq}"
    for checkpoint_id, path in trained["paths"].items():
        assert path == f"tinker://{run_id}/{checkpoint_id}"


def test_health_and_capabilities_name_the_served_model(tinker_server, trained, base_model):
    health = httpx.get(f"{tinker_server.base_url}/api/v1/healthz", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    capabilities = trained["rest"].get_server_capabilities().result(TIMEOUT_S)
    assert base_model in [m.model_name for m in capabilities.supported_models]


def test_list_training_runs_shows_the_run(trained, base_model):
    page = trained["rest"].list_training_runs(limit=100).result(TIMEOUT_S)
    runs = {run.training_run_id: run for run in page.training_runs}
    assert trained["run_id"] in runs
    run = runs[trained["run_id"]]
    assert run.base_model == base_model and run.is_lora and run.lora_rank == RANK
    assert page.cursor.total_count >= 1 and page.cursor.limit == 100


def test_list_training_runs_pages_with_offset_and_limit(tinker_server, trained, base_model):
    extra = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.key_a)
    extra.create_lora_training_client(base_model=base_model, rank=RANK).result(TIMEOUT_S)
    rest = trained["rest"]
    everything = rest.list_training_runs(limit=100).result(TIMEOUT_S)
    assert everything.cursor.total_count == len(everything.training_runs) >= 2
    first = rest.list_training_runs(limit=1, offset=0).result(TIMEOUT_S)
    second = rest.list_training_runs(limit=1, offset=1).result(TIMEOUT_S)
    assert len(first.training_runs) == len(second.training_runs) == 1
    assert first.training_runs[0].training_run_id != second.training_runs[0].training_run_id
    assert first.cursor.total_count == everything.cursor.total_count
    extra.close("success").result(TIMEOUT_S)


def test_get_training_run_by_id_and_by_path(trained, base_model):
    rest, run_id = trained["rest"], trained["run_id"]
    run = rest.get_training_run(run_id).result(TIMEOUT_S)
    assert run.training_run_id == run_id and run.base_model == base_model
    assert run.model_owner and run.lora_rank == RANK and not run.corrupted
    assert run.last_checkpoint is not None
    assert run.last_checkpoint.checkpoint_type == "training"
    assert run.last_checkpoint.tinker_path == trained["paths"]["weights/r2"]
    assert run.last_sampler_checkpoint is not None
    assert run.last_sampler_checkpoint.tinker_path == trained["paths"]["sampler_weights/s1"]
    by_path = rest.get_training_run_by_tinker_path(trained["paths"]["weights/r1"])
    assert by_path.result(TIMEOUT_S).training_run_id == run_id


def test_list_checkpoints_of_the_run_and_of_the_user(trained):
    rest, run_id, paths = trained["rest"], trained["run_id"], trained["paths"]
    listed = rest.list_checkpoints(run_id).result(TIMEOUT_S).checkpoints
    assert {c.checkpoint_id: c.tinker_path for c in listed} == paths
    kinds = {c.checkpoint_id: c.checkpoint_type for c in listed}
    assert kinds == {
        "weights/r1": "training",
        "weights/r2": "training",
        "sampler_weights/s1": "sampler",
    }
    mine = rest.list_user_checkpoints(limit=100).result(TIMEOUT_S).checkpoints
    assert set(paths.values()) <= {c.tinker_path for c in mine}


def test_weights_info_describes_the_lora(trained, base_model):
    info = trained["rest"].get_weights_info_by_tinker_path(trained["paths"]["weights/r1"])
    info = info.result(TIMEOUT_S)
    assert info.base_model == base_model and info.is_lora and info.lora_rank == RANK


def test_a_sampling_client_made_from_a_path_is_listed_in_its_session(trained, base_model):
    rest, sampler_path = trained["rest"], trained["paths"]["sampler_weights/s1"]
    trained["service"].create_sampling_client(model_path=sampler_path).result(TIMEOUT_S)
    session_id = trained["run_id"].rsplit(":train:", 1)[0]
    sampler_ids = rest.get_session(session_id).result(TIMEOUT_S).sampler_ids
    samplers = [rest.get_sampler(i).result(TIMEOUT_S) for i in sampler_ids]
    assert [(s.base_model, s.model_path) for s in samplers] == [(base_model, sampler_path)]
    assert samplers[0].sampler_id == sampler_ids[0]


def test_session_lists_its_training_run(trained):
    rest, run_id = trained["rest"], trained["run_id"]
    session_id = run_id.rsplit(":train:", 1)[0]
    assert session_id in rest.list_sessions(limit=100).result(TIMEOUT_S).sessions
    assert run_id in rest.get_session(session_id).result(TIMEOUT_S).training_run_ids


def test_the_twinkle_client_sees_the_same_run_and_checkpoints(tinker_server, trained):
    run_id = trained["run_id"]
    with TwinkleClient(tinker_server.base_url, tinker_server.key_a) as client:
        assert run_id in [r.training_run_id for r in client.list_training_runs(limit=100)]
        names = {c.twinkle_path.rsplit("/", 1)[-1] for c in client.list_checkpoints(run_id)}
    assert {"r1", "r2"} <= names


def test_delete_checkpoint_by_id_and_by_path(trained):
    rest, run_id, paths = trained["rest"], trained["run_id"], trained["paths"]
    rest.delete_checkpoint(run_id, "weights/r1").result(TIMEOUT_S)
    rest.delete_checkpoint_from_tinker_path(paths["sampler_weights/s1"]).result(TIMEOUT_S)
    left = [c.checkpoint_id for c in rest.list_checkpoints(run_id).result(TIMEOUT_S).checkpoints]
    assert left == ["weights/r2"]
    with pytest.raises(tinker.NotFoundError):
        rest.delete_checkpoint(run_id, "weights/r1").result(TIMEOUT_S)
    with pytest.raises(tinker.NotFoundError):
        rest.get_weights_info_by_tinker_path(paths["weights/r1"]).result(TIMEOUT_S)


def test_a_twinkle_client_checkpoint_is_a_tinker_checkpoint(tinker_server, trained, base_model):
    """The other direction: a run made with the Twinkle client, listed and loaded by the SDK."""
    from twinkle_client.model import MultiLoraTransformersModel

    with TwinkleClient(tinker_server.base_url, tinker_server.key_a) as client:
        model = MultiLoraTransformersModel(model_id=base_model, client=client)
        model.add_adapter_to_model("default", {"r": RANK, "target_modules": "all-linear"})
        twinkle_path = model.save("from-twinkle", save_optimizer=False)
        run_id = model.training_run_id()
    assert twinkle_path == f"twinkle://{run_id}/weights/from-twinkle"
    tinker_path = "tinker://" + twinkle_path.removeprefix("twinkle://")
    rest = trained["rest"]
    listed = rest.list_checkpoints(run_id).result(TIMEOUT_S).checkpoints
    assert [c.tinker_path for c in listed] == [tinker_path]
    assert rest.get_weights_info_by_tinker_path(tinker_path).result(TIMEOUT_S).lora_rank == RANK
    loaded = trained["service"].create_training_client_from_state(tinker_path).result(TIMEOUT_S)
    assert loaded.get_info().model_data.model_name == base_model
