"""Sampler: the protocol every sampler follows (TorchSampler, vLLMSampler).

``sampler.sample(inputs, sampling_params, adapter_name=..., num_samples=...)`` takes prompt
InputFeatures (``Template.encode(..., add_generation_prompt=True)``) or Trajectories (which
the sampler encodes that way with its template) and returns one SampleResponse per prompt,
in input order, each holding ``num_samples`` SampledSequences. A sequence's
``new_input_feature`` is prompt plus completion with labels on the completion only, so the
list of them goes straight into ``model.forward_backward``. ``sample_many`` takes several
such calls (``SampleRequest``s, of different adapters) and generates them as one batch.

Weight sync (``twinkle.checkpoint_engine``) talks to a sampler through ``weight_names()``
(name -> shape and dtype of what it can receive), ``load_weights`` (full tensors by name),
``load_lora`` (one adapter's tensors and config) and, between Ray groups,
``load_checkpoint`` (a folder ``model.save`` wrote).
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from twinkle.data_format import SampleResponse, SamplingParams
from twinkle.infra import remote_function
from twinkle.model.checkpoint import ADAPTER_FILES, full_weight_files
from twinkle.template import Template, build_template

BASE_MODEL = "__base__"
"""``adapter_name`` that samples the base model even when LoRA adapters are loaded."""


@dataclass
class SampleRequest:
    """One ``sample(inputs, sampling_params, adapter_name=..., num_samples=...)`` call, an
    item of ``sample_many``."""

    inputs: Any
    sampling_params: SamplingParams | Mapping[str, Any] | None = None
    adapter_name: str | None = None
    num_samples: int | None = None
    on_token: Callable[[int, int, Any], None] | None = None
    """Hears each token as it is drawn, as ``(row, token id, its logprob pairs)``, rows
    numbered prompt by prompt, ``num_samples`` each; only samplers whose ``streams_tokens``
    is True call it, and only in the caller's process."""


class Sampler(ABC):
    """Generates completions for prompts; subclasses implement the abstract methods and set
    ``model_id`` and ``template`` (None until ``set_template``) in their constructor."""

    model_id: str | None
    template: Template | None
    streams_tokens: bool = False
    """Whether ``sample_many`` calls a request's ``on_token`` (TorchSampler does)."""

    @remote_function(dispatch="slice_dp", collect="flatten")
    def sample(
        self,
        inputs: Any,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        *,
        adapter_name: str | None = None,
        num_samples: int | None = None,
    ) -> list[SampleResponse]:
        """One SampleResponse per prompt, in input order. ``adapter_name`` picks a loaded
        LoRA adapter; None picks the 'default' (else the first) one when any is loaded, else
        the base model; ``BASE_MODEL`` always samples the base model."""
        request = SampleRequest(inputs, sampling_params, adapter_name, num_samples)
        outcome = self.sample_many([request])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    @abstractmethod
    def sample_many(
        self, requests: Sequence[SampleRequest]
    ) -> list[list[SampleResponse] | Exception]:
        """Several ``sample`` calls, each's responses or the exception that refused it alone,
        in order."""

    @remote_function(dispatch="all", collect="first")
    def set_template(self, template: Any, **kwargs: Any) -> None:
        """The template that encodes Trajectory prompts and decodes completions (by name or
        class, built for the sampler's ``model_id`` unless ``model_id=`` is given)."""
        if isinstance(template, str | type):
            kwargs.setdefault("model_id", self.model_id)
        self.template = build_template(template, **kwargs)

    def _template(self) -> Template:
        """The template, by default the tokenizer's own chat template for ``model_id``."""
        if self.template is None:
            if self.model_id is None:
                raise ValueError("call sampler.set_template(...): it decodes the completions")
            self.template = Template(self.model_id)
        return self.template

    def _stop_token_ids(self, template: Template) -> set[int]:
        """The ids that end a completion: the tokenizer's EOS and the chat end-of-turn token
        (never the unknown id, which a tokenizer without that token returns for it)."""
        tokenizer = template.tokenizer
        ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
        return {i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id}

    @remote_function(dispatch="all", collect="first")  # noqa: B027 - only caching samplers act
    def reset_prefix_cache(self) -> None:
        """Forget cached prompt prefixes (needed after new weights); a no-op without a cache."""

    @abstractmethod
    def vocab_size(self) -> int:
        """Rows of the model's vocabulary: token ids at or above it are not the model's."""

    @abstractmethod
    def weight_names(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The base weights this sampler receives: name -> (shape, dtype)."""

    @abstractmethod
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy full tensors into the base weights, by name."""

    @remote_function(dispatch="all", collect="first")
    def load_checkpoint(self, path: str | os.PathLike, adapter_name: str = "default") -> None:
        """Load what ``model.save(...)`` wrote: an adapter folder (peft's layout) becomes
        LoRA adapter ``adapter_name``; a full model folder replaces the base weights."""
        folder = Path(path)
        if (folder / ADAPTER_FILES[0]).is_file():
            config = json.loads((folder / ADAPTER_FILES[0]).read_text(encoding="utf-8"))
            self.load_lora(adapter_name, config, load_file(folder / ADAPTER_FILES[1]))
            return
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} holds neither an adapter nor a full model checkpoint")
        for name in full_weight_files(folder):
            self.load_weights(load_file(folder / name).items())

    @abstractmethod
    def load_lora(
        self, adapter_name: str, config: Mapping[str, Any], weights: Mapping[str, torch.Tensor]
    ) -> None:
        """Install (or replace) LoRA adapter ``adapter_name`` from its peft config dict and
        its peft state dict (``get_peft_model_state_dict`` names)."""
