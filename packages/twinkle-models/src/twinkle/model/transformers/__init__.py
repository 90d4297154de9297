"""The Hugging Face Transformers backend."""

from twinkle.model.transformers.model import TransformersModel
from twinkle.model.transformers.value_model import TransformersValueModel

__all__ = ["TransformersModel", "TransformersValueModel"]
