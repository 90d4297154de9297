"""The embedding model: ``task='embedding'`` of a TransformersModel.

A mixin of TransformersModel, kept in its own file as checkpointing is, so the model file
holds the language-model step alone. ``forward_backward(inputs, task='embedding')`` and
``forward_only(inputs, task='embedding')`` come here: the backbone runs without its head,
one vector per sequence is pooled (``twinkle.model.embedding``), and a contrastive loss
(``InfonceLoss``) scores them against the batch's group labels. The pooling helpers and
the group labels' format are ``twinkle.model.embedding``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.data_format import ModelOutput
from twinkle.loss import CrossEntropyLoss
from twinkle.metric import MetricCollection
from twinkle.model.embedding import group_labels, pool, sequence_bounds
from twinkle.model.precision import autocast
from twinkle.model.train_state import TrainState

# The batch keys a Hugging Face backbone takes (the rest are for the loss and the metrics).
MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids")


class EmbeddingModelMixin:
    """Embedding training and inference on the model's backbone, pooled by
    ``embedding_pooling``; the gradients and their normaliser (the loss's anchors)
    accumulate until the step as a language model's do."""

    def _embedding_forward_backward(
        self,
        inputs: Any,
        state: TrainState,
        micro_batch_size: int | None,
        **loss_kwargs: Any,
    ) -> ModelOutput:
        """``forward_backward(task='embedding')``: one pass over the whole batch."""
        if micro_batch_size is not None:
            raise ValueError(
                "task='embedding' takes no micro_batch_size: in-batch negatives make the "
                "loss of a split batch differ; pass smaller batches instead"
            )
        return self._embedding_pass(inputs, state, state.metrics, backward=True, **loss_kwargs)

    def _embedding_forward_only(
        self, inputs: Any, state: TrainState, **loss_kwargs: Any
    ) -> ModelOutput:
        """``forward_only(task='embedding')``: the embeddings, and the loss (fed to the
        evaluation metrics) when the batch carries group labels."""
        return self._embedding_pass(
            inputs, state, state.eval_metrics, backward=False, **loss_kwargs
        )

    def _embed(self, batch: dict) -> dict[str, torch.Tensor]:
        """Run the backbone alone (no LM head, no logits) and pool one embedding per sequence,
        with the batch's real-token count for throughput."""
        if self._parallel().splits_sequences:
            raise NotImplementedError(
                "task='embedding' does not run under Ulysses sequence parallel; build the "
                "embedding model's DeviceMesh without ulysses_size"
            )
        bounds = sequence_bounds(batch)
        backbone = self._hf_model().base_model
        if bounds.packed() and not any(getattr(m, "is_causal", False) for m in backbone.modules()):
            raise ValueError(
                f"{type(backbone).__name__} attends in both directions, so sequences packed "
                "into one row would see each other; collate with "
                "InputProcessor(padding_free=False)"
            )
        model_inputs = {k: batch[k] for k in MODEL_INPUT_KEYS if k in batch}
        with autocast(self.precision, self.device.type):
            hidden = backbone(**model_inputs).last_hidden_state
        return {
            "embeddings": pool(hidden, bounds, self.embedding_pooling),
            "input_tokens": bounds.valid.sum(),
        }

    def _embedding_pass(
        self,
        inputs: Any,
        state: TrainState,
        metrics: MetricCollection,
        backward: bool,
        **loss_kwargs: Any,
    ) -> ModelOutput:
        """Pool, then, when the batch carries group labels, the loss on
        ``({'labels': (N,)}, {'embeddings': (N, H)})``, its backward and the metrics.

        The loss's ``num_tokens`` (anchors, for InfonceLoss) is the normaliser that
        accumulates until the step, as label tokens do for a language-model loss.
        """
        if not isinstance(inputs, Mapping) and not hasattr(inputs, "keys"):
            inputs = list(inputs)  # read twice: collated, and for the group labels
        batch = self._collate(inputs, state)
        if isinstance(inputs, Mapping) and torch.is_tensor(inputs.get("input_ids")):
            labels = batch.get("labels")  # a collated batch: labels are the (N,) group flags
        else:
            labels = group_labels([inputs] if hasattr(inputs, "keys") else inputs)
        if labels is None and backward:
            raise ValueError(
                "task='embedding' training needs group labels: give each feature "
                "'embedding_label' (1 for a group's anchor, 0 for its positive and hard "
                "negatives), or give a collated batch labels of shape (N,)"
            )
        final = self._steps_now(state) if backward else None
        outputs = self._run(state, self._embed, batch, final_backward=final)
        input_tokens = outputs.pop("input_tokens")
        embeddings = outputs["embeddings"]
        if labels is None:
            return ModelOutput(embeddings=embeddings.detach().float().cpu())
        labels = torch.as_tensor(labels, device=self.device)
        if labels.ndim != 1 or labels.numel() != embeddings.shape[0]:
            raise ValueError(
                f"the batch holds {embeddings.shape[0]} sequences but its group labels have "
                f"shape {tuple(labels.shape)}; give one flag per sequence"
            )
        if isinstance(state.loss, CrossEntropyLoss):
            raise ValueError(
                "task='embedding' needs an embedding loss: call set_loss(InfonceLoss, "
                "temperature=...) (the default CrossEntropyLoss trains next-token prediction)"
            )
        loss_inputs = {"labels": labels}
        loss, anchors = self._loss(loss_inputs, outputs, state, **loss_kwargs)
        if backward:
            loss.backward()
            state.pending_tokens += anchors
        metrics.accumulate(
            loss_inputs, outputs, loss=loss.detach(), num_tokens=anchors, input_tokens=input_tokens
        )
        return ModelOutput(
            loss=float(loss.detach()) / anchors,
            embeddings=embeddings.detach().float().cpu(),
            num_tokens=anchors,
        )
