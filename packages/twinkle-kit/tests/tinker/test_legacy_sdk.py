"""The documents' SL and RL flows through whichever Tinker SDK is installed.

The code is version-neutral on purpose: the dev environment runs it with the current SDK
(0.38, protobuf payloads), and the ``tinker_legacy`` nox session runs the very same file
with ``tinker==0.16.1`` (JSON everywhere, a separate ``/forward`` route, create-from-state
through weights_info + create_model + load_weights). SDK 0.16.1 returns clients where 0.38
returns futures of them, only 0.38 has ``ServiceClient.close`` and a standalone
``RestClient``, and 0.16.1 downloads a checkpoint as an archive URL where 0.38 exports
external weights; the code bridges exactly those four differences and nothing else.
"""

from __future__ import annotations

import io
import os
import tarfile
import urllib.request

import numpy as np
import pytest
import tinker
from tinker import types

import twinkle
from twinkle.server.common import input_feature_to_datum

TIMEOUT_S = 180
SL_STEPS = 5
SL_LR = 5e-3  # the tiny model is randomly initialised: a larger rate makes the loss jumpy
LOGPROB_ATOL = 1e-3  # trainer vs sampler on the same weights: float32 CPU, different kernels


def _ready(client_or_future):
    """The client itself (0.16.1) or the result of its creation future (0.38)."""
    if isinstance(client_or_future, tinker.APIFuture):
        return client_or_future.result(TIMEOUT_S)
    return client_or_future


def _sft_data() -> list[types.Datum]:
    """The documents' pipeline: self-cognition -> Template -> DataLoader -> Datum."""
    from twinkle.dataloader import DataLoader
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.preprocessor import SelfCognitionProcessor

    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition", data_slice=range(4)))
    dataset.set_template("Template", model_id="bundled://tiny-qwen3", max_length=64)
    dataset.map(SelfCognitionProcessor("twinkle", "tester"), load_from_cache_file=False)
    dataset.encode(batched=True, load_from_cache_file=False)
    batch = next(iter(DataLoader(dataset=dataset, batch_size=4)))
    return [input_feature_to_datum(feature) for feature in batch]


def _weighted_nll(output, data: list[types.Datum]) -> float:
    total = 0.0
    for out, datum in zip(output.loss_fn_outputs, data, strict=True):
        logprobs = np.asarray(out["logprobs"].tolist(), dtype=np.float64)
        weights = np.asarray(datum.loss_fn_inputs["weights"].tolist(), dtype=np.float64)
        total -= float((logprobs * weights).sum())
    return total


@pytest.fixture(scope="module")
def service(tinker_server):
    client = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.key_b)
    yield client
    if hasattr(client, "close"):  # 0.38 finishes the session; 0.16.1 has no close()
        client.close("success").result(TIMEOUT_S)


@pytest.fixture(scope="module")
def sl_run(service, base_model):
    """SL_STEPS steps of cross_entropy on one batch, then save_state."""
    training = _ready(service.create_lora_training_client(base_model=base_model, rank=4))
    data = _sft_data()
    losses = []
    for _ in range(SL_STEPS):
        fwdbwd = training.forward_backward(data, "cross_entropy")
        optim = training.optim_step(types.AdamParams(learning_rate=SL_LR))
        losses.append(fwdbwd.result(TIMEOUT_S).metrics["loss:sum"])
        optim.result(TIMEOUT_S)
    path = training.save_state("legacy-sl").result(TIMEOUT_S).path
    return {"training": training, "data": data, "losses": losses, "path": path}


def test_the_sdk_is_the_version_this_session_targets():
    """The tinker-legacy nox session sets TWINKLE_EXPECT_TINKER=0.16.1: never test 0.38 twice."""
    expected = os.environ.get("TWINKLE_EXPECT_TINKER")
    assert tinker.__version__ == (expected or tinker.__version__)


def test_get_info_names_the_model(sl_run, base_model):
    info = sl_run["training"].get_info()
    assert info.model_data.model_name == base_model


def test_sl_loss_falls(sl_run):
    losses = sl_run["losses"]
    assert all(np.isfinite(losses)) and losses[0] > 0
    assert all(np.diff(losses) < 0), losses
    assert losses[-1] < 0.97 * losses[0], losses


def test_forward_logprobs_give_the_loss_forward_backward_reports(sl_run):
    training, data = sl_run["training"], sl_run["data"]
    forward = training.forward(data, "cross_entropy").result(TIMEOUT_S)
    fwdbwd = training.forward_backward(data, "cross_entropy").result(TIMEOUT_S)
    for out, datum in zip(forward.loss_fn_outputs, data, strict=True):
        assert len(out["logprobs"].tolist()) == datum.model_input.length
    assert _weighted_nll(forward, data) == pytest.approx(fwdbwd.metrics["loss:sum"], rel=1e-4)
    assert _weighted_nll(fwdbwd, data) == pytest.approx(fwdbwd.metrics["loss:sum"], rel=1e-4)


def test_save_path_and_resume_from_state(service, sl_run):
    path = sl_run["path"]
    assert path.startswith("tinker://") and path.endswith("/weights/legacy-sl")
    data = sl_run["data"]
    expected = sl_run["training"].forward(data, "cross_entropy").result(TIMEOUT_S)
    for create in (
        service.create_training_client_from_state,
        service.create_training_client_from_state_with_optimizer,
    ):
        resumed = _ready(create(path))
        assert resumed.model_id != sl_run["training"].model_id
        got = resumed.forward(data, "cross_entropy").result(TIMEOUT_S)
        for a, b in zip(got.loss_fn_outputs, expected.loss_fn_outputs, strict=True):
            np.testing.assert_allclose(a["logprobs"].tolist(), b["logprobs"].tolist(), atol=1e-5)


def _rest(tinker_server, service):
    if hasattr(tinker, "RestClient"):  # 0.38: standalone; 0.16.1: only from a ServiceClient
        return tinker.RestClient(base_url=tinker_server.base_url, api_key=tinker_server.key_b)
    return service.create_rest_client()


def test_rest_client_lists_the_run_and_its_checkpoint(tinker_server, service, sl_run):
    rest = _rest(tinker_server, service)
    run_id = sl_run["training"].model_id
    runs = rest.list_training_runs(limit=100).result(TIMEOUT_S).training_runs
    assert run_id in [r.training_run_id for r in runs]
    checkpoints = rest.list_checkpoints(run_id).result(TIMEOUT_S).checkpoints
    assert sl_run["path"] in [c.tinker_path for c in checkpoints]


def _download(tinker_server, service, sl_run, folder) -> None:
    """The run's checkpoint as a peft folder, the way each SDK gets one: 0.16.1 asks for the
    checkpoint's archive URL, 0.38 exports external weights and fetches each file's URL."""
    rest = _rest(tinker_server, service)
    folder.mkdir()
    if hasattr(rest, "get_checkpoint_archive_url_from_tinker_path"):
        url = rest.get_checkpoint_archive_url_from_tinker_path(sl_run["path"]).result(TIMEOUT_S)
        with urllib.request.urlopen(url.url) as answer:
            data = answer.read()
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                (folder / member.name).write_bytes(tar.extractfile(member).read())
        return
    export = sl_run["training"].save_weights_external("legacy-export").result(TIMEOUT_S).path
    for name, url in rest.get_external_weights_urls(export).result(TIMEOUT_S).urls.items():
        urllib.request.urlretrieve(url, str(folder / name))


def test_a_downloaded_checkpoint_loads_in_peft_with_the_trainers_logprobs(
    tinker_server, service, sl_run, base_model, tmp_path
):
    import torch
    from peft import PeftModel

    from twinkle.model.transformers.loading import load_causal_lm

    _download(tinker_server, service, sl_run, tmp_path / "adapter")
    base, _ = load_causal_lm(base_model, None, None, seed=0)
    model = PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    datum = sl_run["data"][0]
    ids = torch.tensor([datum.model_input.to_ints()])
    targets = torch.tensor(datum.loss_fn_inputs["target_tokens"].tolist())
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[0]
    peft_logprobs = logps.gather(-1, targets[:, None])[:, 0].numpy()
    trainer = sl_run["training"].forward([datum], "cross_entropy").result(TIMEOUT_S)
    expected = trainer.loss_fn_outputs[0]["logprobs"].tolist()
    np.testing.assert_allclose(peft_logprobs, expected, atol=LOGPROB_ATOL)


def test_publish_lets_another_key_read_and_a_ttl_out_of_range_is_refused(
    tinker_server, service, sl_run
):
    rest, path = _rest(tinker_server, service), sl_run["path"]
    other_service = tinker.ServiceClient(
        base_url=tinker_server.base_url, api_key=tinker_server.key_a
    )
    other = other_service.create_rest_client()  # a RestClient of key a in both SDKs
    with pytest.raises(tinker.NotFoundError):
        other.get_weights_info_by_tinker_path(path).result(TIMEOUT_S)
    rest.publish_checkpoint_from_tinker_path(path).result(TIMEOUT_S)
    assert other.get_weights_info_by_tinker_path(path).result(TIMEOUT_S).lora_rank == 4
    rest.unpublish_checkpoint_from_tinker_path(path).result(TIMEOUT_S)
    with pytest.raises(tinker.NotFoundError):
        other.get_weights_info_by_tinker_path(path).result(TIMEOUT_S)
    with pytest.raises(tinker.BadRequestError, match="limits.max_checkpoint_ttl_s"):
        rest.set_checkpoint_ttl_from_tinker_path(path, -1).result(TIMEOUT_S)
    rest.set_checkpoint_ttl_from_tinker_path(path, 3600).result(TIMEOUT_S)
    listed = rest.list_checkpoints(sl_run["training"].model_id).result(TIMEOUT_S).checkpoints
    assert [c.expires_at is not None for c in listed if c.tinker_path == path] == [True]
    rest.set_checkpoint_ttl_from_tinker_path(path, None).result(TIMEOUT_S)
    if hasattr(other_service, "close"):
        other_service.close("success").result(TIMEOUT_S)


def test_rl_step_sample_importance_sampling_ppo_and_sync(sl_run):
    """sample -> importance_sampling -> optim_step -> ppo -> optim_step -> a fresh sampler."""
    training = sl_run["training"]
    sampling = _ready(training.save_weights_and_get_sampling_client())
    prompt_tokens = sl_run["data"][0].model_input.to_ints()[:12]
    prompt = types.ModelInput.from_ints(prompt_tokens)
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7, stop=[])
    sampled = sampling.sample(prompt, num_samples=2, sampling_params=params).result(TIMEOUT_S)
    assert len(sampled.sequences) == 2

    data = []
    for sequence, advantage in zip(sampled.sequences, (1.0, -1.0), strict=True):
        assert len(sequence.tokens) == 6 and len(sequence.logprobs) == 6  # stop=[]: never early
        full = prompt_tokens + list(sequence.tokens)
        n, p = len(full) - 1, len(prompt_tokens) - 1
        old = [0.0] * p + list(sequence.logprobs)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(full[:-1]),
                loss_fn_inputs={
                    "target_tokens": types.TensorData(data=full[1:], dtype="int64", shape=[n]),
                    "logprobs": types.TensorData(data=old, dtype="float32", shape=[n]),
                    "advantages": types.TensorData(
                        data=[0.0] * p + [advantage] * (n - p), dtype="float32", shape=[n]
                    ),
                },
            )
        )

    out = training.forward_backward(data, "importance_sampling").result(TIMEOUT_S)
    for datum_out, sequence in zip(out.loss_fn_outputs, sampled.sequences, strict=True):
        trainer = np.asarray(datum_out["logprobs"].tolist())[-len(sequence.tokens) :]
        np.testing.assert_allclose(trainer, sequence.logprobs, atol=LOGPROB_ATOL)
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result(TIMEOUT_S)
    clip = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    ppo = training.forward_backward(data, "ppo", clip).result(TIMEOUT_S)
    assert np.isfinite(ppo.metrics["loss:sum"])
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result(TIMEOUT_S)

    synced = _ready(training.save_weights_and_get_sampling_client())
    prompt_logprobs = synced.compute_logprobs(prompt).result(TIMEOUT_S)
    assert len(prompt_logprobs) == len(prompt_tokens) and prompt_logprobs[0] is None
    trainer = training.forward(sl_run["data"][:1], "cross_entropy").result(TIMEOUT_S)
    trainer_logprobs = trainer.loss_fn_outputs[0]["logprobs"].tolist()[: len(prompt_tokens) - 1]
    np.testing.assert_allclose(prompt_logprobs[1:], trainer_logprobs, atol=LOGPROB_ATOL)


def test_twinkle_paths_name_the_same_checkpoint_after_init_tinker_client(
    tinker_server, service, sl_run
):
    """The SDK refuses twinkle:// on the client; init_tinker_client() makes each path-taking
    call take it: the same weights (logprobs, samples) as through the tinker:// path."""
    twinkle.init_tinker_client()
    path = sl_run["path"]
    twinkle_path = "twinkle://" + path[len("tinker://") :]
    data = sl_run["data"][:1]
    resumed = _ready(service.create_training_client_from_state(path))
    expected = resumed.forward(data, "cross_entropy").result(TIMEOUT_S).loss_fn_outputs

    from_twinkle = _ready(service.create_training_client_from_state(twinkle_path))
    from_twinkle.load_state(twinkle_path).result(TIMEOUT_S)
    got = from_twinkle.forward(data, "cross_entropy").result(TIMEOUT_S).loss_fn_outputs
    np.testing.assert_allclose(got[0]["logprobs"].tolist(), expected[0]["logprobs"].tolist())

    prompt = types.ModelInput.from_ints(data[0].model_input.to_ints()[:8])
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=5, stop=[])
    samples = []
    for model_path in (path, twinkle_path):
        sampling = _ready(service.create_sampling_client(model_path=model_path))
        result = sampling.sample(prompt, num_samples=1, sampling_params=params).result(TIMEOUT_S)
        samples.append(list(result.sequences[0].tokens))
    assert samples[0] == samples[1] and len(samples[0]) == 4

    info = _rest(tinker_server, service).get_weights_info_by_tinker_path(twinkle_path)
    assert info.result(TIMEOUT_S).lora_rank == 4
