"""MultiLoraTransformersModel: one base model, a bounded pool of LoRA adapters.

The server's model: many tenants each train their own adapter on one shared base model.
It is a TransformersModel whose adapters are slots of a pool: at most ``max_loras`` at
once, each of rank at most ``max_rank``, and ``remove_adapter`` frees a slot. Adapters
stay isolated because a step touches only the active adapter's parameters (peft marks
the others frozen, and each adapter's optimizer holds its own parameters alone), and
because each adapter draws its randomness (LoRA dropout) from its own generators
(``unit_random.RandomStream``), seeded from its initial seed and saved with its checkpoint:
a tenant's losses do not depend on its neighbours' work, nor on their resumes.
``forward_backward_many`` (and ``forward_only_many``) runs several tenants' calls as one pass,
each row through its own adapter (``tenant_pass``, ``lora_rows``), with the results of each
call run alone.

Not supported: ``modules_to_save`` (it would train full copies of base modules per
tenant) and full-parameter training (the base model is shared).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist
from peft import LoraConfig, PeftConfig
from torch import nn

from twinkle.data_format import ModelOutput
from twinkle.infra import remote_function
from twinkle.model.train_state import TrainState
from twinkle.model.transformers.lora_rows import unsupported
from twinkle.model.transformers.model import TransformersModel
from twinkle.model.transformers.tenant_pass import TenantRequest, forward_backward_many
from twinkle.model.unit_random import RandomStream, derived_seed


class LoraPoolFullError(RuntimeError):
    """Every LoRA slot is taken: remove an adapter or raise ``max_loras``."""


class MultiLoraTransformersModel(TransformersModel):
    """A TransformersModel holding at most ``max_loras`` LoRA adapters of rank <= ``max_rank``."""

    def __init__(
        self,
        model_id: str | os.PathLike | None = None,
        *,
        max_loras: int = 4,
        max_rank: int = 32,
        **kwargs: Any,
    ) -> None:
        for name, value in (("max_loras", max_loras), ("max_rank", max_rank)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        super().__init__(model_id, **kwargs)
        self.max_loras = max_loras
        self.max_rank = max_rank
        self._row_reasons: dict[str, str | None] = {}  # see tenant_pass.solo_reason
        # Whether the base model drops out in training (its masks would come from the
        # process's generators, not the tenants'): such a model's tenants never share a pass.
        self.base_dropout = any(
            isinstance(m, nn.Dropout) and m.p > 0 for m in self._hf_model().modules()
        )

    def _add_adapter(
        self,
        adapter_name: str,
        config_or_path: PeftConfig | str | os.PathLike,
        gradient_accumulation_steps: int,
        init_seed: int | None = None,
    ) -> TrainState:
        """Take a slot; the adapter's dropout draws from its own stream, seeded from the seed
        of its initial weights (and this worker's rank: data-parallel ranks mask apart)."""
        if len(self.adapter_names) >= self.max_loras:
            raise LoraPoolFullError(
                f"all {self.max_loras} LoRA slots are in use; remove an adapter first"
            )
        if isinstance(config_or_path, PeftConfig):
            self._check_config(config_or_path)
        if init_seed is None:
            init_seed = self._init_seed(adapter_name)
        state = super()._add_adapter(
            adapter_name, config_or_path, gradient_accumulation_steps, init_seed
        )
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        state.random_stream = RandomStream(derived_seed(init_seed, "dropout", rank), self.device)
        # Whether its rows can share a pass: fixed by its layers, so found once.
        self._row_reasons[adapter_name] = unsupported(self.model, adapter_name)
        return state

    @remote_function(dispatch="all", collect="first")
    def add_seeded_adapter(
        self,
        adapter_name: str,
        config: PeftConfig,
        gradient_accumulation_steps: int = 1,
        *,
        seed: int,
    ) -> None:
        """``add_adapter_to_model`` with the new weights drawn from ``seed`` (a tenant's LoRA
        seed) instead of the model's seed and the name, leaving the process's random state
        as it was."""
        self._add_adapter(adapter_name, config, gradient_accumulation_steps, seed)

    def _check_config(self, config: PeftConfig) -> None:
        if not isinstance(config, LoraConfig):
            raise ValueError(f"only LoRA adapters are pooled, got {type(config).__name__}")
        if config.r > self.max_rank:
            raise ValueError(f"LoRA rank {config.r} exceeds this model's max_rank {self.max_rank}")
        if config.modules_to_save:
            raise ValueError(
                "modules_to_save is not supported on a shared base model: it would train full "
                "copies of base modules; train LoRA matrices only"
            )

    @remote_function(dispatch="all", collect="first")
    def forward_backward_many(
        self, requests: Sequence[TenantRequest]
    ) -> list[ModelOutput | Exception]:
        """Several adapters' ``forward_backward`` calls as one forward and one backward
        (``tenant_pass``): each request's output, or the exception that refused it alone, in
        order. Each adapter's gradient, normaliser, metrics and dropout masks are those of its
        call run by itself. On a Ray group every worker runs every request: give it one worker
        (data-parallel workers would each train on all the rows)."""
        return forward_backward_many(self, requests)

    @remote_function(dispatch="all", collect="first")
    def forward_only_many(self, requests: Sequence[TenantRequest]) -> list[ModelOutput | Exception]:
        """Several adapters' ``forward_only`` calls as one forward without gradients: each
        request's output (its loss counted in its adapter's evaluation metrics and kept for
        its ``calculate_loss``), or the exception that refused it alone, in order."""
        return forward_backward_many(self, requests, training=False)

    @remote_function(dispatch="all", collect="first")
    def remove_adapter(self, adapter_name: str) -> None:
        """Delete the adapter, its optimizer and its state, freeing its slot.

        peft is left naming a live adapter as its active one (or none when the pool is
        empty): its ``delete_adapter`` keeps naming the deleted adapter when it was the
        last, which a later adapter's save would then look up."""
        self._state(adapter_name)  # raises for an unknown name
        self.model.delete_adapter(adapter_name)
        del self._states[adapter_name]
        self._row_reasons.pop(adapter_name, None)
        self._active = None
        remaining = self.adapter_names
        if remaining:
            self._activate(self._states[remaining[0]])
        else:
            self.model.active_adapter = self.model.base_model.active_adapter  # []

    @remote_function(dispatch="all", collect="first")
    def pad_token_id(self) -> int:
        """The id that pads batches (0 when the model's config names none)."""
        return self.model.config.pad_token_id or 0

    @remote_function(dispatch="all", collect="first")
    def vocab_size(self) -> int:
        """How many token ids the logits score (the output embedding's rows): the bound a
        client's token ids must stay under."""
        return int(self._hf_model().get_output_embeddings().weight.shape[0])

    @remote_function(dispatch="all", collect="first")
    def model_folder(self) -> str | None:
        """The local folder the base model (and its tokenizer) came from, if any."""
        return None if self.model_dir is None else str(self.model_dir)

    @remote_function(dispatch="all", collect="first")
    def capacity(self) -> dict[str, int]:
        used = len(self.adapter_names)
        return {
            "max_loras": self.max_loras,
            "used_loras": used,
            "free_loras": self.max_loras - used,
        }
