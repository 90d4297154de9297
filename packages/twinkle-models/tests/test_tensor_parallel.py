"""Tensor parallel's bad inputs, refused at setup before any process group is needed (the
training itself is test_parallel_strategies' tp and fsdp_tp cases under torchrun)."""

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from twinkle.hub import resolve_model
from twinkle.mesh import DeviceMesh
from twinkle.model.transformers.strategy.parallelize import parallelize


def model_of(name: str, **changes):
    config = AutoConfig.from_pretrained(resolve_model(f"bundled://{name}"))
    for key, value in changes.items():
        setattr(config, key, value)
    return AutoModelForCausalLM.from_config(config)


def mesh(**sizes) -> DeviceMesh:
    return DeviceMesh.from_sizes(device_type="cpu", **sizes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "tp_size=8 does not divide the model's 4 attention heads"),
        ({"num_attention_heads": 8}, "tp_size=8 does not divide the model's 2 key/value heads"),
    ],
)
def test_tp_that_does_not_divide_the_heads_names_both_numbers(changes, message):
    with pytest.raises(ValueError, match=message):
        parallelize(model_of("tiny-qwen3", **changes), mesh(tp_size=8))


def test_a_family_without_a_plan_names_those_with_one():
    with pytest.raises(ValueError, match="no tensor-parallel plan for 'phi3'") as info:
        parallelize(model_of("tiny-phi4"), mesh(tp_size=2))
    assert "gemma3, llama, mistral, qwen2, qwen3 families" in str(info.value)


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({"tp_size": 2, "dp_size": 2}, "DDP does not take tensor-parallel weights.*fsdp_size=2"),
        ({"tp_size": 2, "dp_size": 2, "ulysses_size": 2}, "does not combine with ulysses_size"),
        ({"pp_size": 2}, "pp=2: pipeline and context parallel need MegatronModel"),
    ],
)
def test_meshes_tp_cannot_run_on_say_what_to_use(sizes, message):
    with pytest.raises(ValueError, match=message):
        parallelize(model_of("tiny-qwen3"), mesh(**sizes))


def test_a_tp_mesh_is_checked_against_the_launched_processes():
    with pytest.raises(ValueError, match="torchrun --nproc_per_node=2"):
        parallelize(model_of("tiny-llama3"), mesh(tp_size=2))
