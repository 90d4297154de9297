"""The Hugging Face Transformers backend."""

from twinkle.model.transformers.model import TransformersModel

__all__ = ["TransformersModel"]
