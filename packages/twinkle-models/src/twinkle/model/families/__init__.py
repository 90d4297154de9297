"""Model families: each family's MoE layout, router and Megatron conversion rules in one
place (one file per family group here), read by expert parallel and MegatronModel.

``family_of(config)`` gives a config's :class:`ModelFamily` (None for a type no family
declares); :func:`register_family` adds one.
"""

from twinkle.model.families.base import (
    EXPERT_WEIGHTS,
    MegatronRules,
    ModelFamily,
    MoeLayout,
    PipelineLayout,
    unwrapped,
)
from twinkle.model.families.registry import (
    DECLARES,
    FAMILIES,
    family_of,
    known_families,
    model_type_of,
    register_family,
)
from twinkle.model.families.routing import own_forward, softmax_top_k

__all__ = [
    "DECLARES",
    "EXPERT_WEIGHTS",
    "FAMILIES",
    "MegatronRules",
    "ModelFamily",
    "MoeLayout",
    "PipelineLayout",
    "family_of",
    "known_families",
    "model_type_of",
    "own_forward",
    "register_family",
    "softmax_top_k",
    "unwrapped",
]
