"""The known families by ``model_type``, and the lookup generic code goes through."""

from __future__ import annotations

from typing import Any

from twinkle.model.families.base import ModelFamily
from twinkle.model.families.deepseek import DEEPSEEK_V3, GLM4_MOE
from twinkle.model.families.dense import GEMMA3, LLAMA, MISTRAL, PHI3
from twinkle.model.families.qwen import QWEN2, QWEN3, QWEN3_5, QWEN3_MOE

FAMILIES: dict[str, ModelFamily] = {}
"""Families by model_type; add one with :func:`register_family`."""

DECLARES = (
    "a family file declares a ModelFamily(name, model_types, moe=MoeLayout(route, router, "
    "experts, shared, shared_gate), megatron=MegatronRules(...)) and passes it to "
    "twinkle.model.families.register_family"
)


def register_family(family: ModelFamily) -> ModelFamily:
    """Make ``family`` known for each of its model types (a type is taken only once)."""
    for model_type in family.model_types:
        taken = FAMILIES.get(model_type, family)
        if taken is not family:
            raise ValueError(f"model_type {model_type!r} already belongs to family {taken.name}")
        FAMILIES[model_type] = family
    return family


for _family in (
    QWEN2,
    QWEN3,
    QWEN3_MOE,
    QWEN3_5,
    LLAMA,
    MISTRAL,
    GEMMA3,
    PHI3,
    DEEPSEEK_V3,
    GLM4_MOE,
):
    register_family(_family)


def model_type_of(config: Any) -> str:
    """The text model's ``model_type`` (a multimodal config's text part)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "model_type", None) or getattr(config, "model_type", "")


def family_of(config: Any) -> ModelFamily | None:
    """The family of a model config, or None when no family file declares its type."""
    return FAMILIES.get(model_type_of(config))


def known_families(predicate=lambda family: True) -> str:
    """The names of the families (those ``predicate`` keeps), for error messages."""
    return ", ".join(sorted({f.name for f in FAMILIES.values() if predicate(f)}))
