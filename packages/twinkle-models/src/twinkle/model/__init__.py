"""TwinkleModel and its backends: TransformersModel now, MegatronModel with its issue."""

from twinkle.model.base import TwinkleModel
from twinkle.model.checkpoint import CheckpointError
from twinkle.model.transformers import TransformersModel

__all__ = ["CheckpointError", "TransformersModel", "TwinkleModel"]
