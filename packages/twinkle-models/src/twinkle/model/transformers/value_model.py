"""TransformersValueModel: the critic of PPO, a causal LM's backbone with a scalar head.

Built on transformers' ``AutoModelForTokenClassification`` with one label: the backbone of
the checkpoint (or of the bundled config's random init) and a linear ``score`` head giving
one number per position. Everything else is TransformersModel's: LoRA adapters (the head
is trained in full beside them, peft's ``modules_to_save``) or full training, DDP and
FSDP2 from the DeviceMesh, save/load/resume, metrics. Sequence parallel is not offered:
the value head has no vocabulary for the Ulysses plan to gather.

Values are aligned with labels like logps: ``values[b, t]`` is the head's output at
position t - 1, the value of the state before label token t is produced (0 at t = 0).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any

import torch
from peft import PeftConfig
from transformers import AutoConfig, AutoModelForTokenClassification

from twinkle.data_format import ModelOutput
from twinkle.hub import resolve_model
from twinkle.loss import PPOValueLoss
from twinkle.model.precision import autocast
from twinkle.model.train_state import TrainState
from twinkle.model.transformers.embedding_model import MODEL_INPUT_KEYS
from twinkle.model.transformers.loading import has_weights
from twinkle.model.transformers.model import TransformersModel

VALUE_HEAD = "score"  # AutoModelForTokenClassification's head


class TransformersValueModel(TransformersModel):
    """A value model from the same ids as TransformersModel (``bundled://tiny-qwen3``, a
    hub id, a folder; a folder saved by this class keeps its trained head).
    ``forward_only(inputs)['values']`` is (B, T) aligned with labels (a key: a
    ModelOutput's ``.values`` attribute is the mapping's method);
    ``forward_backward(inputs, returns=..., old_values=...)`` trains with the model's loss,
    ``PPOValueLoss()`` unless ``set_loss`` chose another that reads ``outputs['values']``.
    """

    def __init__(self, model_id: str | os.PathLike | None = None, **kwargs: Any) -> None:
        if kwargs.get("model_cls") is not None:
            raise ValueError("TransformersValueModel builds its own model class; drop model_cls")
        if kwargs.get("sequence_parallel") is not None:
            raise NotImplementedError(
                "TransformersValueModel does not run under Ulysses sequence parallel; build "
                "it without sequence_parallel (DDP and FSDP2 work)"
            )
        kwargs["model_cls"] = AutoModelForTokenClassification
        if model_id is not None and kwargs.get("config") is None:
            folder = resolve_model(str(model_id))
            if has_weights(folder):
                kwargs["num_labels"] = 1
            else:
                kwargs["config"] = AutoConfig.from_pretrained(folder, num_labels=1)
        elif kwargs.get("config") is not None:  # a copy: the caller's config stays theirs
            kwargs["config"] = copy.deepcopy(kwargs["config"])
            kwargs["config"].num_labels = 1
        super().__init__(model_id, **kwargs)
        # No dropout before the head: a training forward must see the values the advantages
        # were computed with (old_values come from a forward without dropout).
        hf_model = self._hf_model()
        hf_model.config.classifier_dropout = 0.0
        hf_model.dropout.p = 0.0

    def _new_state(self, name: str, gradient_accumulation_steps: int) -> TrainState:
        state = super()._new_state(name, gradient_accumulation_steps)
        state.loss = PPOValueLoss()
        return state

    def _add_adapter(
        self, adapter_name, config_or_path, gradient_accumulation_steps, init_seed=None
    ):
        """LoRA on the backbone, with the new value head trained in full beside it."""
        if isinstance(config_or_path, PeftConfig):
            kept = list(getattr(config_or_path, "modules_to_save", None) or [])
            if VALUE_HEAD not in kept:
                config_or_path = dataclasses.replace(
                    config_or_path, modules_to_save=[*kept, VALUE_HEAD]
                )
        return super()._add_adapter(
            adapter_name, config_or_path, gradient_accumulation_steps, init_seed
        )

    def _check_task(self, task: str) -> str:
        if task != "causal_lm":
            raise ValueError(
                f"TransformersValueModel scores tokens; task={task!r} is not offered (leave "
                "task at its default)"
            )
        return task

    def _forward(self, batch: dict) -> dict[str, torch.Tensor]:
        """The head's scalar per position, shifted to align with labels. ``logps`` carries
        the detached values through TransformersModel's plumbing (its outputs list); the
        loss never sees it (``_loss``)."""
        model_inputs = {k: batch[k] for k in MODEL_INPUT_KEYS if k in batch}
        with autocast(self.precision, self.device.type):
            head = self.model(**model_inputs, use_cache=False).logits[..., 0].float()
        values = torch.cat([head.new_zeros(head.shape[0], 1), head[:, :-1]], dim=1)
        return {"values": values, "logps": values.detach(), "value_head": head}

    def _loss(self, batch: dict, outputs: dict, state: TrainState, **loss_kwargs: Any):
        view = {"values": outputs["values"]}
        loss, num_tokens = super()._loss(batch, view, state, **loss_kwargs)
        outputs.update({k: v for k, v in view.items() if k != "values"})
        return loss, num_tokens

    def forward_backward(self, inputs: Any, **kwargs: Any) -> ModelOutput:
        """TransformersModel's forward_backward; the output holds ``values`` (not logps)."""
        return _as_values(super().forward_backward(inputs, **kwargs))

    @torch.no_grad()
    def forward_only(
        self, inputs: Any, *, adapter_name: str | None = None, **loss_kwargs: Any
    ) -> ModelOutput:
        """The ``values`` (B, T) of a batch, without gradients; given the loss's inputs
        (``returns``, ``old_values``) also its loss, as TransformersModel's forward_only."""
        if loss_kwargs:
            return _as_values(
                super().forward_only(inputs, adapter_name=adapter_name, **loss_kwargs)
            )
        state = self._state(adapter_name)
        self.model.eval()
        state.pending_forward = state.pending_loss = None
        if self._is_idle_share(inputs, "forward_only"):
            return ModelOutput(values=torch.empty(0, 0))
        batch = self._collate(inputs, state)
        return ModelOutput(values=self._run(state, self._forward, batch)["values"].cpu())

    def _idle_backward(self, state: TrainState) -> None:
        """A zero backward through the head, for a data-parallel worker with no rows."""
        pad = torch.full((1, 1), self._pad_token_id() or 0, device=self.device)
        batch = {"input_ids": pad, "attention_mask": torch.ones_like(pad)}
        outputs = self._run(state, self._forward, batch, final_backward=self._steps_now(state))
        (outputs["value_head"].sum() * 0).backward()


def _as_values(output: ModelOutput) -> ModelOutput:
    return ModelOutput(loss=output.loss, values=output.logps, num_tokens=output.num_tokens)
