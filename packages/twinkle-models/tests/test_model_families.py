"""The family registry: every bundled model has a family, the MoE layouts find exactly the
MoE blocks the models have, and a family is declared once."""

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from twinkle.hub import resolve_model
from twinkle.hub.bundled import bundled_names
from twinkle.model.families import FAMILIES, ModelFamily, family_of, register_family

MOE_LAYERS = {  # bundled MoE model -> how many of its 2 layers are MoE blocks
    "tiny-qwen3-moe": 2,
    "tiny-qwen3.5-moe": 2,
    "tiny-deepseek-v3": 1,  # first_k_dense_replace=1
    "tiny-glm4.5": 1,
}


@pytest.mark.parametrize("name", bundled_names("model"))
def test_every_bundled_model_has_a_family_whose_layout_finds_its_moe_blocks(name):
    config = AutoConfig.from_pretrained(resolve_model(f"bundled://{name}"))
    family = family_of(config)
    assert family is not None and config.model_type in family.model_types
    model = AutoModelForCausalLM.from_config(config)
    blocks = [m for m in model.modules() if family.is_moe_block(m)]
    assert len(blocks) == MOE_LAYERS.get(name, 0)
    # A family may hold dense and MoE variants (Qwen3.5); a dense family has no layout.
    assert family.moe is not None or name not in MOE_LAYERS
    for block in blocks:
        shared = family.moe.shared
        assert shared is None or hasattr(block, shared)


def test_megatron_families_are_the_ones_megatron_converts():
    megatron = sorted(f.name for f in set(FAMILIES.values()) if f.megatron is not None)
    assert megatron == [
        "deepseek_v3",
        "glm4_moe",
        "llama",
        "mistral",
        "phi3",
        "qwen2",
        "qwen3",
        "qwen3_moe",
    ]


def test_a_model_type_belongs_to_one_family():
    with pytest.raises(ValueError, match="'qwen3' already belongs to family qwen3"):
        register_family(ModelFamily("my_qwen3", ("qwen3",)))
    assert FAMILIES["qwen3"].name == "qwen3"


def test_an_unknown_model_type_has_no_family():
    config = AutoConfig.for_model("qwen3")
    config.model_type = "something_else"
    assert family_of(config) is None
