"""Contrastive (InfoNCE) loss for embedding models, and the batch layout it reads.

Layout (the user's documents): rows of ``outputs['embeddings']`` (N, D) come in groups,
and ``inputs['labels']`` (N,) marks each group's first row with 1 and the others with 0::

    embeddings: [anchor_0, positive_0, neg_0_1, ..., anchor_1, positive_1, ...]
    labels:     [   1,         0,         0,   ...,    1,         0,     ...]

A group is its anchor, then its positive, then any number of hard negatives.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from twinkle.loss.base import Loss, LossInputs
from twinkle.loss.fields import compute_dtype
from twinkle.loss.registry import LOSSES


class EmbeddingLayout(NamedTuple):
    """Row indices of a grouped embedding batch (see the module docstring)."""

    anchors: torch.Tensor  # (G,) row of each group's anchor
    positives: torch.Tensor  # (G,) row of each group's positive
    group_ids: torch.Tensor  # (N,) group of each row
    hard_negatives: torch.Tensor  # (G,) number of hard negatives in each group


def embedding_layout(labels: Any, device: torch.device | None = None) -> EmbeddingLayout:
    """Parse the group-start ``labels`` (N,) of an embedding batch; also for metrics."""
    labels = torch.as_tensor(labels, device=device)
    if labels.ndim != 1 or labels.numel() == 0:
        raise ValueError(
            f"embedding labels must be one 0/1 flag per row (N,), got shape {tuple(labels.shape)}"
        )
    if not ((labels == 0) | (labels == 1)).all():
        raise ValueError("embedding labels must be 1 (a group's anchor) or 0 (its other rows)")
    labels = labels.long()
    if labels[0] != 1:
        raise ValueError("embedding labels must start with 1: the first row is an anchor")
    anchors = labels.nonzero().flatten()
    group_ids = labels.cumsum(0) - 1
    sizes = torch.bincount(group_ids, minlength=anchors.numel())
    lonely = (sizes < 2).nonzero().flatten().tolist()
    if lonely:
        raise ValueError(
            f"embedding groups {lonely} have an anchor but no positive: each row labelled 1 "
            f"must be followed by its positive (labelled 0)"
        )
    return EmbeddingLayout(anchors, anchors + 1, group_ids, sizes - 2)


@LOSSES.register
class InfonceLoss(Loss):
    """InfoNCE over cosine similarities, normalised by anchors.

    With unit-normalised embeddings and ``s(x, y) = x . y / temperature``, for each group g
    with anchor a_g and positive p_g, over its candidate rows C_g::

        l_g = -log( exp(s(a_g, p_g)) / sum over c in C_g of exp(s(a_g, c)) )

    C_g is every non-anchor row of the batch when ``use_batch`` (the other groups'
    positives and hard negatives serve as in-batch negatives), else only the group's own
    positive and hard negatives. ``hard_negatives=k`` checks that every group carries
    exactly k hard negatives (a data bug fails early); None accepts any number.
    ``loss = sum_g l_g``, ``num_tokens`` = the number of anchors. Embeddings gathered
    from other data ranks must be concatenated, in this layout, before the call.
    """

    reads = LossInputs()

    def __init__(
        self, temperature: float = 0.07, use_batch: bool = True, hard_negatives: int | None = None
    ) -> None:
        if temperature <= 0:
            raise ValueError(f"InfonceLoss: temperature must be positive, got {temperature}")
        if hard_negatives is not None and hard_negatives < 0:
            raise ValueError(f"InfonceLoss: hard_negatives must be >= 0, got {hard_negatives}")
        self.temperature = temperature
        self.use_batch = use_batch
        self.hard_negatives = hard_negatives

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = type(self).__name__
        embeddings = outputs.get("embeddings")
        if embeddings is None or inputs.get("labels") is None:
            raise ValueError(
                f"{owner} needs outputs['embeddings'] (N, D) and inputs['labels'] (N,), "
                f"1 for each group's anchor and 0 for its positive and hard negatives"
            )
        layout = embedding_layout(inputs["labels"], embeddings.device)
        if embeddings.ndim != 2 or embeddings.shape[0] != layout.group_ids.numel():
            raise ValueError(
                f"{owner}: embeddings have shape {tuple(embeddings.shape)} but labels mark "
                f"{layout.group_ids.numel()} rows; expected ({layout.group_ids.numel()}, D)"
            )
        self._check_negatives(layout.hard_negatives)
        unit = F.normalize(embeddings.to(compute_dtype(embeddings)), dim=-1)
        is_candidate = torch.ones_like(layout.group_ids, dtype=torch.bool)
        is_candidate[layout.anchors] = False
        candidates = is_candidate.nonzero().flatten()
        scores = unit[layout.anchors] @ unit[candidates].T / self.temperature
        if not self.use_batch:
            groups = torch.arange(layout.anchors.numel(), device=scores.device)
            own = layout.group_ids[candidates][None, :] == groups[:, None]
            scores = scores.masked_fill(~own, float("-inf"))
        target = torch.searchsorted(candidates, layout.positives)
        rows = torch.arange(target.numel(), device=scores.device)
        per_anchor = torch.logsumexp(scores, dim=1) - scores[rows, target]
        num_anchors = torch.tensor(layout.anchors.numel(), device=scores.device)
        return {"loss": per_anchor.sum(), "num_tokens": num_anchors}

    def _check_negatives(self, counts: torch.Tensor) -> None:
        if self.hard_negatives is not None and (counts != self.hard_negatives).any():
            raise ValueError(
                f"InfonceLoss(hard_negatives={self.hard_negatives}): groups carry "
                f"{counts.tolist()} hard negatives; give each group exactly "
                f"{self.hard_negatives}, or pass hard_negatives=None"
            )
        if not self.use_batch and (counts == 0).any():
            raise ValueError(
                "InfonceLoss(use_batch=False) contrasts an anchor with its own group only, "
                f"but groups {(counts == 0).nonzero().flatten().tolist()} have no hard "
                "negatives; add them or use use_batch=True"
            )
