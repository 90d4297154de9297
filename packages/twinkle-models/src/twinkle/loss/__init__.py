"""Losses: cross entropy (plain and chunked over the vocabulary), RL policy gradients
(GRPO, GSPO, CISPO), DPO, InfoNCE for embeddings and MSE.

Every loss is called as ``loss(inputs, outputs, **kwargs)`` and returns ``{'loss': sum,
'num_tokens': normaliser}``; the model divides once per optimizer step. The protocol and
the label/logps alignment conventions are in ``twinkle.loss.base``; the three forms of
model outputs a token-level loss accepts are in ``twinkle.loss.logps``.
"""

from twinkle.loss.base import IGNORE_INDEX, Loss
from twinkle.loss.chunked_cross_entropy import ChunkedCrossEntropyLoss
from twinkle.loss.chunked_logps import (
    chunked_linear_logps,
    chunked_logits_logps,
    default_chunk_size,
)
from twinkle.loss.cross_entropy import CrossEntropyLoss
from twinkle.loss.embedding import EmbeddingLayout, InfonceLoss, embedding_layout
from twinkle.loss.fields import align_to_labels, label_mask
from twinkle.loss.logps import (
    TokenLogps,
    chunked_logps,
    logps_from_logits,
    prefers_chunked,
    token_logps,
)
from twinkle.loss.preference import DPOLoss
from twinkle.loss.registry import LOSSES, build_loss
from twinkle.loss.regression import MSELoss
from twinkle.loss.rl import CISPOLoss, GRPOLoss, GSPOLoss

__all__ = [
    "IGNORE_INDEX",
    "LOSSES",
    "CISPOLoss",
    "ChunkedCrossEntropyLoss",
    "CrossEntropyLoss",
    "DPOLoss",
    "EmbeddingLayout",
    "GRPOLoss",
    "GSPOLoss",
    "InfonceLoss",
    "Loss",
    "MSELoss",
    "TokenLogps",
    "align_to_labels",
    "build_loss",
    "chunked_linear_logps",
    "chunked_logits_logps",
    "chunked_logps",
    "default_chunk_size",
    "embedding_layout",
    "label_mask",
    "logps_from_logits",
    "prefers_chunked",
    "token_logps",
]
