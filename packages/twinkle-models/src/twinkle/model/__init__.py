"""TwinkleModel and its backends: TransformersModel and MegatronModel (megatron-core is imported
only when a MegatronModel is built)."""

from twinkle.model.base import TwinkleModel
from twinkle.model.checkpoint import CheckpointError
from twinkle.model.megatron import MegatronModel
from twinkle.model.transformers import TransformersModel, TransformersValueModel

__all__ = [
    "CheckpointError",
    "MegatronModel",
    "TransformersModel",
    "TransformersValueModel",
    "TwinkleModel",
]
