"""Scoring a batch for a loss: the policy's own logps as its weights are now (the proximal
policy of DecoupledPPOLoss), the reference policy's logps (the same model with its LoRA
adapter disabled, so a KL to the reference needs no second copy of the weights) and a
teacher's full next-token logits (GKD).

A mixin of TransformersModel, in its own file as checkpointing is. The methods run without
gradients, touch no optimizer, metric or accumulation state, and in Ray mode run on the
model's own device group, each worker scoring its rows (``collect='rows'`` joins them).
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle.infra import remote_function
from twinkle.model.batch_dispatch import slice_dp_rows
from twinkle.model.train_state import FULL_MODEL


class ScoringMixin:
    """``policy_logps``, ``reference_logps`` and ``token_logits`` for TransformersModel."""

    @remote_function(dispatch=slice_dp_rows, collect="rows")
    @torch.no_grad()
    def policy_logps(
        self, inputs: Any, *, adapter_name: str | None = None, routing_replay: bool | None = None
    ) -> torch.Tensor:
        """The label-token logps (B, T) of the policy with its weights as they are now, with
        no loss computed (``forward_only`` runs the set loss, which may need inputs a scoring
        pass does not have): DecoupledPPOLoss's ``prox_logps``, taken just before the update
        that trains on the batch. With routing replay on (``TransformersModel(
        routing_replay=True)`` or this call's ``routing_replay``) it records the experts, as
        ``forward_only`` does, for ``forward_backward`` on the batch to replay."""
        self._refuse_pipeline("policy_logps")
        state = self._state(adapter_name)
        self.model.eval()
        if self._is_idle_share(inputs, "policy_logps"):
            return torch.empty(0, 0)
        batch = self._labelled_batch(inputs, state, "policy_logps")
        record = self._routing.active(routing_replay)
        splits = record and self._parallel().splits_sequences
        with self._routing.record(self._hf_model(), batch, state.name, splits, record):
            outputs = self._run(state, self._forward, batch)
        return outputs["logps"].float().cpu()

    @remote_function(dispatch=slice_dp_rows, collect="rows")
    @torch.no_grad()
    def reference_logps(self, inputs: Any, *, adapter_name: str | None = None) -> torch.Tensor:
        """The label-token logps (B, T) of the base model under the adapter: the LoRA
        policy's reference, computed by the same weights with the adapter disabled. Pass
        them as ``ref_logps`` (GRPO-family losses with ``beta > 0``, DPOLoss). A model
        trained in full has no adapter to disable: its reference is a second, frozen
        model's ``forward_only(inputs).logps``."""
        self._refuse_pipeline("reference_logps")
        state = self._state(adapter_name)
        if state.name == FULL_MODEL:
            raise ValueError(
                "reference_logps disables the LoRA adapter, and this model has none (it trains "
                "every weight): load the reference as a second TransformersModel and pass its "
                "forward_only(inputs).logps as ref_logps"
            )
        self.model.eval()
        if self._is_idle_share(inputs, "reference_logps"):
            return torch.empty(0, 0)
        batch = self._labelled_batch(inputs, state, "reference_logps")
        with self.model.disable_adapter():
            outputs = self._run(state, self._forward, batch)
        return outputs["logps"].float().cpu()

    @remote_function(dispatch=slice_dp_rows, collect="rows")
    @torch.no_grad()
    def token_logits(self, inputs: Any, *, adapter_name: str | None = None) -> torch.Tensor:
        """The full next-token logits (B, T, V) of a batch, float32 on the CPU: a teacher's
        distributions for ``GKDLoss(teacher_logits=...)``. Position t predicts token t + 1,
        as the student's logits do."""
        self._refuse_pipeline("token_logits")
        state = self._state(adapter_name)
        self.model.eval()
        if self._is_idle_share(inputs, "token_logits"):
            return torch.empty(0, 0, 0)
        batch = {k: v for k, v in self._collate(inputs, state).items() if k != "labels"}
        return self._run(state, self._forward, batch)["logits"].float().cpu()

    def _labelled_batch(self, inputs: Any, state: Any, method: str) -> dict:
        batch = self._collate(inputs, state)
        if "labels" not in batch:
            raise ValueError(
                f"{method} scores label tokens: give the batch labels (the completion "
                f"tokens), as for forward_backward"
            )
        return batch

    def _refuse_pipeline(self, method: str) -> None:
        if self._parallel().pipeline is not None:
            raise ValueError(
                f"{method} does not run under pipeline parallel (pp_size > 1) yet: each rank "
                f"holds only its stages, and the scoring pass does not run the schedule; "
                f"score the batch with a model on a mesh without pp"
            )
