"""Weight sync between two Ray groups by a bucketed broadcast (gloo, local CPU cluster): the
model trains on a 'model' group of two workers, replicated (dp=2) or sharded by FSDP2
(fsdp=2), and a TorchSampler runs on a 'sampler' group of one. The first sync sends the base
weights and the adapter in 64 KiB buckets, later ones only the adapter. After a sync the
sampler's logprobs of its own sample equal the trainer's within 1e-4 (max abs difference,
float32); before it, after a training step, they differ by more than 1e-3, so the check can
fail. Merged syncs work from both layouts; different architectures fail before anything moves;
a sender that fails releases the waiting sampler workers and the link keeps working."""

import pytest
import torch
from peft import LoraConfig

import twinkle
from twinkle import DeviceGroup, DeviceMesh
from twinkle.checkpoint_engine import CheckpointEngineManager
from twinkle.data_format import SamplingParams
from twinkle.infra import reset
from twinkle.infra.ray import runtime as ray_runtime
from twinkle.model import TransformersModel
from twinkle.sampler import TorchSampler

MODEL_ID = "bundled://tiny-qwen3"
PROMPT = [{"messages": [{"role": "user", "content": "Who are you?"}]}]
ANSWER = {"role": "assistant", "content": "I am Twinkle, a small model."}
TRAIN = [{"messages": [*PROMPT[0]["messages"], ANSWER]}] * 4
BUCKET_BYTES = 64 * 1024
TOLERANCE = 1e-4
TIMEOUT_S = 120  # per collective: a broken sync fails the test instead of hanging it


@pytest.fixture(scope="module")
def groups(ray_cluster):
    twinkle.initialize(
        "ray",
        groups=[
            DeviceGroup(name="model", ranks=2, device_type="cpu"),
            DeviceGroup(name="sampler", ranks=1, device_type="cpu"),
        ],
        lazy_collect=False,
    )
    yield
    ray_runtime.shutdown()
    reset()


def build_model(mesh: DeviceMesh) -> TransformersModel:
    model = TransformersModel(model_id=MODEL_ID, device_mesh=mesh, remote_group="model")
    model.add_adapter_to_model(
        "default", LoraConfig(r=4, lora_alpha=16, target_modules="all-linear")
    )
    model.set_template("Qwen3_5Template")
    model.set_optimizer("AdamW", lr=2e-2)
    return model


def build_sampler(**kwargs) -> TorchSampler:
    sampler = TorchSampler(MODEL_ID, remote_group="sampler", **kwargs)
    sampler.set_template("Qwen3_5Template")
    return sampler


def logprob_gap(model, sampler) -> float:
    """Max |sampler logprob - trainer logprob| over the sampler's own completion tokens."""
    params = SamplingParams(max_tokens=12, seed=0, logprobs=1)
    sequence = sampler.sample(PROMPT, params)[0].sequences[0]
    feature = sequence.new_input_feature
    trainer = model.forward_only(inputs=[feature, feature]).logps[0]  # one row per dp rank
    trainer = trainer[torch.tensor(feature.labels) != -100].float()
    ours = torch.tensor([p[0][1] for p in sequence.logprobs])
    assert len(ours) == len(trainer) > 0
    return float((trainer - ours).abs().max())


MESHES = pytest.mark.parametrize(
    "mesh",
    [
        DeviceMesh.from_sizes(dp_size=2, device_type="cpu"),
        DeviceMesh.from_sizes(fsdp_size=2, device_type="cpu"),
    ],
    ids=["dp2", "fsdp2"],
)


@MESHES
def test_lora_sync_between_groups_by_bucketed_broadcast(groups, mesh):
    model, sampler = build_model(mesh), build_sampler()
    manager = CheckpointEngineManager(
        model, sampler, bucket_bytes=BUCKET_BYTES, timeout_s=TIMEOUT_S
    )
    first = manager.sync_weights(merge_and_sync=False)
    assert first.kinds == ("base", "lora")
    assert first.buckets >= 6  # ~1.3 MB of base weights in 64 KiB buckets, then the adapter
    assert logprob_gap(model, sampler) < TOLERANCE

    model.forward_backward(inputs=TRAIN)
    model.clip_grad_and_step()
    assert logprob_gap(model, sampler) > 1e-3  # the sampler is stale until the next sync

    second = manager.sync_weights(merge_and_sync=False)
    assert second.kinds == ("lora",) and second.bytes * 20 < first.bytes
    assert logprob_gap(model, sampler) < TOLERANCE


@MESHES
def test_merged_sync_between_groups(groups, mesh):
    model, sampler = build_model(mesh), build_sampler()
    model.forward_backward(inputs=TRAIN)
    model.clip_grad_and_step()
    manager = CheckpointEngineManager(
        model, sampler, bucket_bytes=BUCKET_BYTES, timeout_s=TIMEOUT_S
    )
    stats = manager.sync_weights(merge_and_sync=True)
    assert stats.kinds == ("base",) and stats.buckets >= 6
    assert logprob_gap(model, sampler) < TOLERANCE
    with pytest.raises(ValueError, match="keep to it"):
        manager.sync_weights(merge_and_sync=False)


def test_different_architectures_fail_before_anything_moves(groups, sampler):
    config = sampler.model.config.to_dict()  # the session's local tiny sampler
    config.update(num_hidden_layers=1, layer_types=config["layer_types"][:1])
    model = build_model(DeviceMesh.from_sizes(dp_size=2, device_type="cpu"))
    other = build_sampler(config=type(sampler.model.config).from_dict(config))
    with pytest.raises(ValueError, match="different architectures.*the sampler lacks"):
        CheckpointEngineManager(model, other).sync_weights(merge_and_sync=False)


def test_a_failing_sender_releases_the_receivers(groups):
    model, sampler = (
        build_model(DeviceMesh.from_sizes(dp_size=2, device_type="cpu")),
        build_sampler(),
    )
    manager = CheckpointEngineManager(
        model, sampler, bucket_bytes=BUCKET_BYTES, timeout_s=TIMEOUT_S
    )
    with pytest.raises(Exception, match="no adapter 'missing'"):
        manager.sync_weights(merge_and_sync=False, adapter_name="missing")
    stats = manager.sync_weights(merge_and_sync=False)  # the link still works afterwards
    assert stats.kinds == ("base", "lora")
    assert logprob_gap(model, sampler) < TOLERANCE
