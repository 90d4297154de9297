"""Losses: cross entropy (plain and chunked over the vocabulary, with DFT weighting), RL
policy gradients (GRPO, GSPO, CISPO, SAPO, BNPO, Dr. GRPO, PPO with its value loss, and
decoupled PPO for stale asynchronous rollouts),
preference losses (DPO, SimPO, CPO, ORPO), distillation (GKD), InfoNCE for embeddings and
MSE.

Every loss is called as ``loss(inputs, outputs, **kwargs)`` and returns ``{'loss': sum,
'num_tokens': normaliser}``; the model divides once per optimizer step. The protocol and
the label/logps alignment conventions are in ``twinkle.loss.base``; the three forms of
model outputs a token-level loss accepts are in ``twinkle.loss.logps``.
"""

from twinkle.loss.base import IGNORE_INDEX, Loss, LossInputs
from twinkle.loss.chunked_cross_entropy import ChunkedCrossEntropyLoss
from twinkle.loss.chunked_logps import (
    chunked_linear_logps,
    chunked_logits_logps,
    default_chunk_size,
)
from twinkle.loss.cross_entropy import CrossEntropyLoss
from twinkle.loss.decoupled import DecoupledPPOLoss
from twinkle.loss.distillation import GKDLoss
from twinkle.loss.embedding import EmbeddingLayout, InfonceLoss, embedding_layout
from twinkle.loss.fields import align_to_labels, label_mask
from twinkle.loss.grpo_variants import BNPOLoss, DRGRPOLoss, SAPOLoss
from twinkle.loss.kl import KL_ESTIMATORS, kl_estimate
from twinkle.loss.logps import (
    TokenLogps,
    chunked_logps,
    logps_from_logits,
    prefers_chunked,
    token_logps,
)
from twinkle.loss.policy_inputs import clipped_objective
from twinkle.loss.ppo import PPOLoss, PPOValueLoss
from twinkle.loss.preference import DPOLoss
from twinkle.loss.reference_free import CPOLoss, ORPOLoss, SimPOLoss
from twinkle.loss.registry import LOSSES, build_loss
from twinkle.loss.regression import MSELoss
from twinkle.loss.rl import CISPOLoss, GRPOLoss, GSPOLoss, TokenPolicyLoss

__all__ = [
    "IGNORE_INDEX",
    "KL_ESTIMATORS",
    "LOSSES",
    "BNPOLoss",
    "CISPOLoss",
    "CPOLoss",
    "DRGRPOLoss",
    "ChunkedCrossEntropyLoss",
    "CrossEntropyLoss",
    "DPOLoss",
    "DecoupledPPOLoss",
    "EmbeddingLayout",
    "GKDLoss",
    "GRPOLoss",
    "GSPOLoss",
    "InfonceLoss",
    "Loss",
    "LossInputs",
    "MSELoss",
    "ORPOLoss",
    "PPOLoss",
    "PPOValueLoss",
    "SAPOLoss",
    "SimPOLoss",
    "TokenLogps",
    "TokenPolicyLoss",
    "align_to_labels",
    "build_loss",
    "chunked_linear_logps",
    "chunked_logits_logps",
    "chunked_logps",
    "clipped_objective",
    "default_chunk_size",
    "embedding_layout",
    "kl_estimate",
    "label_mask",
    "logps_from_logits",
    "prefers_chunked",
    "token_logps",
]
