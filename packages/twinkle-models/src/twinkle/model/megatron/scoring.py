"""MegatronModel's ``policy_logps``: the label-token logps of the policy with its weights as
they are now, with no loss run (DecoupledPPOLoss's proximal policy), the contract and return
layout of TransformersModel's (``twinkle.model.transformers.scoring``).

A mixin of MegatronModel. The pass is Megatron's schedule run forward only, so it scores on
every mesh MegatronModel trains on (pipeline stages, tensor and context parallel ranks); it
touches no optimizer, metric or accumulation state.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle.infra import remote_function
from twinkle.model.batch_dispatch import slice_dp_rows


class MegatronScoringMixin:
    """``policy_logps`` for MegatronModel."""

    @remote_function(dispatch=slice_dp_rows, collect="rows")
    @torch.no_grad()
    def policy_logps(
        self, inputs: Any, *, adapter_name: str | None = None, routing_replay: bool | None = None
    ) -> torch.Tensor:
        """The label-token logps (B, T), float32 on the CPU, of the policy as it is now,
        aligned with the labels as ``forward_only(inputs).logps`` is, with no loss computed
        (the set loss may need inputs a scoring pass does not have): DecoupledPPOLoss's
        ``prox_logps``, taken just before the update that trains on the batch. The same on
        every rank. ``routing_replay`` is TransformersModel's; MegatronModel refuses it."""
        from twinkle.model.megatron.schedule import run_schedule

        if routing_replay:
            raise ValueError(
                "policy_logps(routing_replay=True): MegatronModel does not record experts for "
                "replay (TransformersModel(routing_replay=True) does); call it without"
            )
        state = self._state(adapter_name)
        for chunk in self.chunks:
            chunk.eval()
        batch, loss_kwargs, restore = self._collate(inputs, state, {})
        if "labels" not in batch:
            raise ValueError(
                "policy_logps scores label tokens: give the batch labels (the completion "
                "tokens), as for forward_backward"
            )
        micro = self._micro_batches(batch, loss_kwargs, None)
        _, _, logps = run_schedule(
            self.chunks, micro, self.spec, state, forward_only=True, score_only=True
        )
        return restore(logps).float()
