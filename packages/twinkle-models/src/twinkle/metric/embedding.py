"""EmbeddingMetric: mean cosine similarity of anchor-positive and anchor-negative pairs.

Layout: the one ``InfonceLoss`` reads, parsed by the same ``embedding_layout``.
``outputs['embeddings']`` is (N, H), one row per text, and ``inputs['labels']`` is (N,) with 1
on each anchor and 0 on the other rows of its group. A group is ``[anchor, positive, hard
negatives...]``; groups may differ in size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.loss.embedding import embedding_layout
from twinkle.metric._values import tensor_field
from twinkle.metric.base import METRICS, Metric


@METRICS.register
class EmbeddingMetric(Metric):
    """``pos_sim`` = mean cos(anchor, its positive); ``neg_sim`` = mean cos(anchor, negative).

    An anchor's negatives are the loss's candidates other than its positive: its own group's
    hard negatives and, with ``use_batch=True`` (as ``InfonceLoss(use_batch=True)``), every
    non-anchor row of the other groups. Means run over all pairs since the reset; ``neg_sim``
    is left out while no negative pair was seen (a single pair, no hard negatives). Ignores
    calls without ``outputs['embeddings']``. Per process: negatives gathered from other ranks
    are not counted.
    """

    def __init__(self, use_batch: bool = True) -> None:
        self.use_batch = use_batch
        self.reset()

    def reset(self) -> None:
        self._pos_sum: torch.Tensor | float = 0.0
        self._pos_count = 0
        self._neg_sum: torch.Tensor | float = 0.0
        self._neg_count = 0

    def accumulate(
        self,
        inputs: Mapping[str, Any] | None = None,
        outputs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if outputs is None or "embeddings" not in outputs:
            return
        embeddings = tensor_field(outputs, "embeddings", "outputs", "EmbeddingMetric")
        labels = tensor_field(inputs or {}, "labels", "inputs", "EmbeddingMetric")
        layout = embedding_layout(labels.cpu())
        num_rows = layout.group_ids.numel()
        if embeddings.ndim != 2 or embeddings.shape[0] != num_rows:
            raise ValueError(
                f"EmbeddingMetric: outputs['embeddings'] has shape {tuple(embeddings.shape)} but "
                f"labels mark {num_rows} rows; expected ({num_rows}, hidden)"
            )
        negative = _negatives(layout.group_ids, layout.anchors, self.use_batch)
        self._pos_count += layout.anchors.numel()
        self._neg_count += int(negative.sum())

        device = embeddings.device
        unit = F.normalize(embeddings.detach().float(), dim=-1)
        anchors = layout.anchors.to(device)
        similarity = unit[anchors] @ unit.T  # (groups, rows)
        groups = torch.arange(anchors.numel(), device=device)
        self._pos_sum = self._pos_sum + similarity[groups, anchors + 1].sum()
        self._neg_sum = self._neg_sum + similarity[negative.to(device)].sum()

    def calculate(self) -> dict[str, float]:
        if not self._pos_count:
            return {}
        result = {"pos_sim": float(self._pos_sum) / self._pos_count}
        if self._neg_count:
            result["neg_sim"] = float(self._neg_sum) / self._neg_count
        return result


def _negatives(group_ids: torch.Tensor, anchors: torch.Tensor, use_batch: bool) -> torch.Tensor:
    """The (groups, rows) mask of each anchor's negatives, on the CPU."""
    rows = torch.arange(group_ids.numel())
    own_group = group_ids[None, :] == torch.arange(anchors.numel())[:, None]
    hard_negative = own_group & (rows[None, :] != anchors[:, None] + 1)
    is_anchor = torch.zeros(group_ids.numel(), dtype=torch.bool)
    is_anchor[anchors] = True
    candidates = (hard_negative | ~own_group) if use_batch else hard_negative
    return candidates & ~is_anchor[None, :]
