"""The Tinker SDK's checkpoint API beyond save and load, against the real server process:
optimizer metrics, external weights (plain and age-encrypted, fetched from their signed
URLs), publish/unpublish and TTLs, each as an unmodified SDK user meets them.

The download test does what ``tinker_cookbook.weights.download`` does for a training
checkpoint, call for call (create a client from the state, export it encrypted to a fresh
age key with a TTL, sign URLs, renew the TTL, fetch and decrypt every file, delete the
export), then loads the folder with plain peft and compares its logprobs with the server's
sampler on the same weights.
"""

from __future__ import annotations

import json
import math
import urllib.request

import pyrage
import pytest
import tinker
import torch
from peft import PeftModel
from tinker import types

from twinkle.model.transformers.loading import load_causal_lm

TIMEOUT_S = 180
RANK = 4
LR = 5e-3
# One fresh Adam step moves every weight by about its rate (a sign step, eps 1e-12), scaled
# by LoRA's alpha / rank = 8: at LR it can overshoot on some starts. At this rate the
# first-order gain dominates on every seed tried (0-3).
RESUMED_LR = 1e-3
SEED = 0  # the adapter's start: without one the server draws it, and the test would vary
CLIP = 0.05  # small enough that the first steps are clipped
TOKENS = [11, 23, 5, 42, 17, 8, 99, 3]
LOGPROB_ATOL = 1e-3  # peft on CPU vs the server's sampler: float32, different kernels


def _datum(tokens: list[int]) -> types.Datum:
    n = len(tokens) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=tokens[1:], dtype="int64", shape=[n]),
            "weights": types.TensorData(data=[1.0] * n, dtype="float32", shape=[n]),
        },
    )


@pytest.fixture(scope="module")
def trained(tinker_server, base_model):
    service = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.key_a)
    training = service.create_lora_training_client(base_model=base_model, rank=RANK, seed=SEED)
    training = training.result(TIMEOUT_S)
    metrics = []
    for _ in range(3):
        training.forward_backward([_datum(TOKENS)], "cross_entropy").result(TIMEOUT_S)
        step = training.optim_step(types.AdamParams(learning_rate=LR, grad_clip_norm=CLIP))
        metrics.append(step.result(TIMEOUT_S).metrics)
    yield {
        "service": service,
        "training": training,
        "rest": tinker.RestClient(base_url=tinker_server.base_url, api_key=tinker_server.key_a),
        "state": training.save_state("final").result(TIMEOUT_S).path,
        "sampler": training.save_weights_for_sampler("final").result(TIMEOUT_S).path,
        "metrics": metrics,
    }
    service.close("success").result(TIMEOUT_S)


def test_optim_step_returns_the_rate_and_the_norm_before_and_after_clipping(trained):
    for metrics in trained["metrics"]:
        assert set(metrics) >= {"learning_rate:mean", "grad_norm:mean", "grad_norm_clipped:mean"}
        assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
        assert metrics["learning_rate:mean"] == pytest.approx(LR)
        norm = metrics["grad_norm:mean"]
        assert norm > 0 and metrics["grad_norm_clipped:mean"] == pytest.approx(min(norm, CLIP))
    assert trained["metrics"][0]["grad_norm:mean"] > CLIP  # the clip did something


def _fetch(urls: dict[str, str], folder, identity=None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, url in urls.items():
        if identity is None:
            urllib.request.urlretrieve(url, str(folder / name))
            continue
        assert name.endswith(".age"), name
        encrypted = folder / name
        urllib.request.urlretrieve(url, str(encrypted))
        pyrage.decrypt_file(str(encrypted), str(folder / name.removesuffix(".age")), [identity])
        encrypted.unlink()


def _peft_prompt_logprobs(folder, base_model: str) -> list[float]:
    base, _ = load_causal_lm(base_model, None, None, seed=0)
    model = PeftModel.from_pretrained(base, str(folder)).eval()
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[0, :-1]
    return logps.gather(-1, ids[0, 1:, None])[:, 0].tolist()


def test_a_cookbook_style_download_loads_in_peft_with_the_samplers_logprobs(
    trained, tinker_server, base_model, tmp_path
):
    # tinker_cookbook.weights.download(tinker_path=<weights/...>), step by step
    identity = pyrage.x25519.Identity.generate()
    service = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.key_a)
    rest = tinker.RestClient(base_url=tinker_server.base_url, api_key=tinker_server.key_a)
    metadata = {"created_by": "tinker_cookbook.weights.download"}
    loaded = service.create_training_client_from_state(trained["state"], user_metadata=metadata)
    export = (
        loaded.result(TIMEOUT_S)
        .save_weights_external(
            "download", ttl_seconds=3600, age_encryption_recipients=[str(identity.to_public())]
        )
        .result(TIMEOUT_S)
        .path
    )
    assert "/external_weights/download" in export
    response = rest.get_external_weights_urls(export).result(TIMEOUT_S)
    rest.set_checkpoint_ttl_from_tinker_path(export, 3600).result(TIMEOUT_S)
    assert sorted(response.urls) == ["adapter_config.json.age", "adapter_model.safetensors.age"]
    listed = rest.list_user_checkpoints(limit=100).result(TIMEOUT_S).checkpoints
    [mine] = [c for c in listed if c.tinker_path == export]
    assert mine.checkpoint_type == "external" and mine.expires_at is not None
    folder = tmp_path / "adapter"
    _fetch(response.urls, folder, identity)
    rest.delete_checkpoint_from_tinker_path(export).result(TIMEOUT_S)
    service.close("success").result(TIMEOUT_S)
    with pytest.raises(tinker.NotFoundError):
        rest.get_external_weights_urls(export).result(TIMEOUT_S)

    downloaded = _peft_prompt_logprobs(folder, base_model)
    sampler = trained["service"].create_sampling_client(model_path=trained["sampler"])
    served = sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result(TIMEOUT_S)
    assert served[0] is None
    assert downloaded == pytest.approx(served[1:], abs=LOGPROB_ATOL)

    # without recipients the exported files are the plain peft folder
    plain = trained["training"].save_weights_external("plain").result(TIMEOUT_S).path
    urls = trained["rest"].get_external_weights_urls(plain).result(TIMEOUT_S).urls
    _fetch(urls, tmp_path / "plain")
    rest_b = tinker.RestClient(base_url=tinker_server.base_url, api_key=tinker_server.key_b)
    with pytest.raises(tinker.NotFoundError):  # another key's export: like none at all
        rest_b.get_external_weights_urls(plain).result(TIMEOUT_S)
    weights = "adapter_model.safetensors"
    assert (tmp_path / "plain" / weights).read_bytes() == (folder / weights).read_bytes()
    configs = [
        json.loads((f / "adapter_config.json").read_text()) for f in (folder, tmp_path / "plain")
    ]
    assert {(c["r"], c["lora_alpha"], c["base_model_name_or_path"]) for c in configs} == {
        (RANK, 32, base_model)
    }


def test_a_published_checkpoint_is_readable_by_another_key_until_unpublished(
    trained, tinker_server
):
    rest_a, path = trained["rest"], trained["state"]
    rest_b = tinker.RestClient(base_url=tinker_server.base_url, api_key=tinker_server.key_b)
    with pytest.raises(tinker.NotFoundError):
        rest_b.get_weights_info_by_tinker_path(path).result(TIMEOUT_S)
    with pytest.raises(tinker.NotFoundError):
        rest_b.publish_checkpoint_from_tinker_path(path).result(TIMEOUT_S)

    rest_a.publish_checkpoint_from_tinker_path(path).result(TIMEOUT_S)
    run_id = trained["training"].model_id
    listed = rest_a.list_checkpoints(run_id).result(TIMEOUT_S).checkpoints
    assert [c.public for c in listed if c.tinker_path == path] == [True]
    assert rest_b.get_weights_info_by_tinker_path(path).result(TIMEOUT_S).lora_rank == RANK
    service_b = tinker.ServiceClient(base_url=tinker_server.base_url, api_key=tinker_server.key_b)
    copy = service_b.create_training_client_from_state(path).result(TIMEOUT_S)
    copy.forward_backward([_datum(TOKENS)], "cross_entropy").result(TIMEOUT_S)  # b trains on
    with pytest.raises(tinker.NotFoundError):  # read-only for b
        rest_b.delete_checkpoint_from_tinker_path(path).result(TIMEOUT_S)
    service_b.close("success").result(TIMEOUT_S)

    rest_a.unpublish_checkpoint_from_tinker_path(path).result(TIMEOUT_S)
    with pytest.raises(tinker.NotFoundError):
        rest_b.get_weights_info_by_tinker_path(path).result(TIMEOUT_S)


def test_a_ttl_out_of_range_is_refused_naming_the_limit(trained):
    rest, path = trained["rest"], trained["sampler"]
    for ttl in (-1, 0, 10**10):
        with pytest.raises(tinker.BadRequestError, match="limits.max_checkpoint_ttl_s"):
            rest.set_checkpoint_ttl_from_tinker_path(path, ttl).result(TIMEOUT_S)
    rest.set_checkpoint_ttl_from_tinker_path(path, 7200).result(TIMEOUT_S)
    run_id = trained["training"].model_id
    listed = rest.list_checkpoints(run_id).result(TIMEOUT_S).checkpoints
    [sampler] = [c for c in listed if c.tinker_path == path]
    assert sampler.expires_at is not None
    rest.set_checkpoint_ttl_from_tinker_path(path, None).result(TIMEOUT_S)
    listed = rest.list_checkpoints(run_id).result(TIMEOUT_S).checkpoints
    assert [c.expires_at for c in listed if c.tinker_path == path] == [None]


def test_the_twinkle_client_downloads_and_imports_what_the_tinker_sdk_trains_on(
    trained, tinker_server, base_model, tmp_path
):
    from twinkle_client import TwinkleClient

    with TwinkleClient(tinker_server.base_url, tinker_server.key_a) as client:
        folder = client.download_checkpoint(trained["state"], tmp_path / "adapter")
        imported = client.import_adapter(folder, "reimported")
        expires = client.set_checkpoint_ttl(imported["tinker_path"], 3600)
        assert expires is not None
    downloaded = _peft_prompt_logprobs(folder, base_model)
    sampler = trained["service"].create_sampling_client(model_path=trained["sampler"])
    served = sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result(TIMEOUT_S)
    assert downloaded == pytest.approx(served[1:], abs=LOGPROB_ATOL)

    # the Tinker SDK continues training from the imported adapter
    resumed = trained["service"].create_training_client_from_state(imported["tinker_path"])
    resumed = resumed.result(TIMEOUT_S)
    before = resumed.forward([_datum(TOKENS)], "cross_entropy").result(TIMEOUT_S)
    original = trained["training"].forward([_datum(TOKENS)], "cross_entropy").result(TIMEOUT_S)
    np_before = before.loss_fn_outputs[0]["logprobs"].tolist()
    assert np_before == pytest.approx(original.loss_fn_outputs[0]["logprobs"].tolist(), abs=1e-5)
    resumed.forward_backward([_datum(TOKENS)], "cross_entropy").result(TIMEOUT_S)
    resumed.optim_step(types.AdamParams(learning_rate=RESUMED_LR)).result(TIMEOUT_S)
    after = resumed.forward([_datum(TOKENS)], "cross_entropy").result(TIMEOUT_S)
    assert sum(after.loss_fn_outputs[0]["logprobs"].tolist()) > sum(np_before)  # it learns
