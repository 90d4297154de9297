"""CheckpointEngineManager in process: after a sync the sampler computes the trainer's logps
(tolerance 1e-4, float32 on CPU); LoRA-only syncs move only adapter tensors; mismatched
architectures and mixed modes are clear errors."""

import pytest
import torch
from peft import LoraConfig

from twinkle.checkpoint_engine import CheckpointEngineManager
from twinkle.data_format import SamplingParams
from twinkle.model import TransformersModel
from twinkle.sampler import TorchSampler

MODEL_ID = "bundled://tiny-qwen3"
PROMPT = [{"messages": [{"role": "user", "content": "Who are you?"}]}]
TRAIN = [
    {"messages": [*PROMPT[0]["messages"], {"role": "assistant", "content": "I am Twinkle."}]}
] * 4


def trained_model(lora: bool) -> TransformersModel:
    """A model moved away from its initial weights, so an unsynced sampler differs from it."""
    model = TransformersModel(model_id=MODEL_ID)
    if lora:
        model.add_adapter_to_model(
            "default", LoraConfig(r=4, lora_alpha=16, target_modules="all-linear")
        )
    model.set_template("Qwen3_5Template")
    model.set_optimizer("AdamW", lr=2e-2)
    for _ in range(3):
        model.forward_backward(inputs=TRAIN)
        model.clip_grad_and_step()
    return model


def new_sampler() -> TorchSampler:
    sampler = TorchSampler(MODEL_ID)
    sampler.set_template("Qwen3_5Template")
    return sampler


def max_logp_gap(model: TransformersModel, sampler: TorchSampler) -> float:
    seq = sampler.sample(PROMPT, SamplingParams(max_tokens=12, seed=0))[0].sequences[0]
    feature = seq.new_input_feature
    trainer = model.forward_only(inputs=[feature]).logps[0]
    trainer = trainer[torch.as_tensor(feature.labels) != -100].float()
    return float((trainer - torch.tensor([p[0][1] for p in seq.logprobs])).abs().max())


@pytest.fixture(scope="module")
def lora_model():
    return trained_model(lora=True)


@pytest.mark.parametrize("lora", [False, True])
def test_after_a_merged_sync_the_sampler_computes_the_trainers_logps(lora, lora_model):
    model = lora_model if lora else trained_model(lora=False)
    sampler = new_sampler()
    assert max_logp_gap(model, sampler) > 1e-2  # not synced yet: a real difference
    stats = CheckpointEngineManager(model, sampler).sync_weights(merge_and_sync=True)
    assert stats.kinds == ("base",)
    assert max_logp_gap(model, sampler) < 1e-4


def test_lora_sync_sends_the_base_once_then_only_the_adapter(lora_model):
    sampler = new_sampler()
    manager = CheckpointEngineManager(lora_model, sampler)
    first = manager.sync_weights(merge_and_sync=False)
    assert max_logp_gap(lora_model, sampler) < 1e-4
    lora_model.forward_backward(inputs=TRAIN)
    lora_model.clip_grad_and_step()
    assert max_logp_gap(lora_model, sampler) > 1e-4  # the adapter moved on
    second = manager.sync_weights(merge_and_sync=False)
    assert first.kinds == ("base", "lora") and second.kinds == ("lora",)
    base_bytes = sum(
        t.numel() * t.element_size() for t in lora_model.model.parameters() if not t.requires_grad
    )
    assert first.bytes - second.bytes == base_bytes  # base (tied head sent once), adapter
    assert second.bytes * 20 < base_bytes  # r=4 on a 64-wide model: about 1.4%
    assert max_logp_gap(lora_model, sampler) < 1e-4


def test_switching_modes_is_refused(lora_model):
    manager = CheckpointEngineManager(lora_model, new_sampler())
    manager.sync_weights(merge_and_sync=False)
    with pytest.raises(ValueError, match="merge_and_sync=False before"):
        manager.sync_weights(merge_and_sync=True)


def test_a_sampler_of_another_architecture_is_a_clear_error():
    model = TransformersModel(model_id=MODEL_ID)
    config = model.model.config.to_dict()
    config.update(intermediate_size=96, num_hidden_layers=3, layer_types=["full_attention"] * 3)
    other = TorchSampler(config=type(model.model.config).from_dict(config))
    with pytest.raises(ValueError, match="different architectures.*model lacks.*shapes differ"):
        CheckpointEngineManager(model, other).sync_weights()


@pytest.mark.parametrize("lora", [False, True])
def test_a_sampler_loads_what_model_save_wrote(lora, lora_model, tmp_path):
    """The path between Ray groups: save on the model side, load_checkpoint on the sampler's."""
    model = lora_model if lora else trained_model(lora=False)
    sampler = new_sampler()
    sampler.load_checkpoint(model.save("sync", output_dir=str(tmp_path), save_optimizer=False))
    assert max_logp_gap(model, sampler) < 1e-4


def test_load_checkpoint_refuses_a_folder_without_weights(tmp_path):
    with pytest.raises(ValueError, match="neither an adapter nor a full model"):
        new_sampler().load_checkpoint(tmp_path)
