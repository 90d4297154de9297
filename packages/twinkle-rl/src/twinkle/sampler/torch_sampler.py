"""TorchSampler: sampling with the model's own forward and KV cache, on any device torch has.

The sampler to test an RL loop on a CPU, and the reference vLLMSampler is checked against.
It holds its own copy of the model, as vLLM does, and receives the trainer's weights through
``CheckpointEngineManager``. No prefix cache, no continuous batching: the prompts of one call
are generated together, ``max_batch_size`` rows at a time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from peft import PeftModel

from twinkle.data_format import SampleResponse, SamplingParams
from twinkle.infra import remote_class, remote_function
from twinkle.mesh import DeviceMesh, Platform
from twinkle.model.transformers.loading import load_causal_lm
from twinkle.sampler.base import BASE_MODEL, Sampler
from twinkle.sampler.decoding import generate
from twinkle.sampler.prompts import (
    as_prompt_features,
    check_sampling_params,
    prompt_token_ids,
    sampled_sequence,
)
from twinkle.sampler.stopping import StopRule
from twinkle.sampler.weights import copy_weights, install_lora, plain_tensors
from twinkle.template import Template
from twinkle.utils import get_logger

logger = get_logger()


def _default_device() -> torch.device:
    device_type = Platform.detect_device_type()
    if device_type in ("cuda", "npu"):
        return torch.device(device_type, Platform.get_local_rank())
    return torch.device(device_type)


def row_seed(base: int, prompt_index: int, sample_index: int) -> int:
    """A 63-bit seed of its own for each (call seed, prompt, sample)."""
    words = np.random.SeedSequence([base, prompt_index, sample_index]).generate_state(2)
    return int((int(words[0]) << 32 | int(words[1])) & (2**63 - 1))


@remote_class(execute="all")
class TorchSampler(Sampler):
    """Samples from a causal LM loaded like TransformersModel loads it (same ids, same seed,
    so a bundled random-init model starts identical to the trainer's).

    ``engine_args`` is accepted so that switching from vLLMSampler is a one-word change; its
    vLLM-only options do not apply here and are logged as ignored. ``seed`` seeds the calls
    whose SamplingParams carry no seed: the run is reproducible, successive calls differ.
    """

    def __init__(
        self,
        model_id: str | os.PathLike | None = None,
        *,
        config: Any = None,
        device_mesh: DeviceMesh | None = None,
        device: str | torch.device | None = None,
        seed: int = 0,
        max_batch_size: int | None = None,
        engine_args: Mapping[str, Any] | None = None,
        **from_pretrained_kwargs: Any,
    ) -> None:
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
        if engine_args:
            logger.warning(
                f"TorchSampler ignores vLLM engine_args: {', '.join(sorted(engine_args))}"
            )
        self.model_id = None if model_id is None else str(model_id)
        self.device_mesh = device_mesh
        self.device = torch.device(device) if device is not None else _default_device()
        self.max_batch_size = max_batch_size
        model, _ = load_causal_lm(model_id, None, config, seed, **from_pretrained_kwargs)
        self.model: torch.nn.Module = model.to(self.device).eval()
        self.template: Template | None = None
        self._generator = torch.Generator().manual_seed(seed)

    # ---- setup ----------------------------------------------------------------------------

    def _stop_token_ids(self, template: Template) -> set[int]:
        """The base ids, plus the EOS ids the model's generation config names."""
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        extra = configured if isinstance(configured, list) else [configured]
        unknown = template.tokenizer.unk_token_id
        own = {i for i in extra if isinstance(i, int) and i != unknown}
        return super()._stop_token_ids(template) | own

    # ---- sampling -------------------------------------------------------------------------

    def _model_for(self, adapter_name: str | None) -> torch.nn.Module:
        """The model to run, with ``adapter_name``'s adapter active (sample() disables the
        adapters for ``BASE_MODEL``)."""
        if adapter_name == BASE_MODEL:
            return self.model
        if not isinstance(self.model, PeftModel):
            if adapter_name is not None:
                raise ValueError(
                    f"the sampler has no adapter {adapter_name!r}: sync one with "
                    "CheckpointEngineManager(model, sampler).sync_weights(merge_and_sync=False)"
                )
            return self.model
        names = list(self.model.peft_config)
        if adapter_name is None:
            adapter_name = "default" if "default" in names else names[0]
        if adapter_name not in names:
            raise ValueError(f"the sampler has no adapter {adapter_name!r}; it has {names}")
        self.model.set_adapter(adapter_name)
        return self.model

    @remote_function(dispatch="slice_dp", collect="flatten")
    def sample(
        self,
        inputs: Any,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        *,
        adapter_name: str | None = None,
        num_samples: int | None = None,
    ) -> list[SampleResponse]:
        params = check_sampling_params(sampling_params, num_samples)
        template = self._template()
        prompts = as_prompt_features(inputs, template)
        prompt_ids = [prompt_token_ids(p) for p in prompts]
        model = self._model_for(adapter_name)
        stop = StopRule.build(params, () if params.ignore_eos else self._stop_token_ids(template))
        base_seed = (
            params.seed
            if params.seed is not None
            else int(torch.randint(2**62, (1,), generator=self._generator))
        )
        rows = [(p, s) for p in range(len(prompts)) for s in range(params.num_samples)]
        chunk = self.max_batch_size or len(rows)
        results = []
        base_only = adapter_name == BASE_MODEL and isinstance(model, PeftModel)
        with model.disable_adapter() if base_only else nullcontext():
            for start in range(0, len(rows), chunk):
                part = rows[start : start + chunk]
                generators = [
                    torch.Generator(self.device).manual_seed(row_seed(base_seed, p, s))
                    for p, s in part
                ]
                results += generate(
                    model,
                    [prompt_ids[p] for p, _ in part],
                    params,
                    generators,
                    stop,
                    template.tokenizer.decode,
                    template.tokenizer.pad_token_id or 0,
                    self.device,
                )
        responses = []
        for p, prompt in enumerate(prompts):
            mine = results[p * params.num_samples : (p + 1) * params.num_samples]
            sequences = [
                sampled_sequence(
                    prompt,
                    prompt_ids[p],
                    r.tokens,
                    r.logprobs,
                    r.stop_reason,
                    stop.cut_text(template.decode(r.tokens, skip_special_tokens=True)),
                )
                for r in mine
            ]
            responses.append(
                SampleResponse(sequences=sequences, prompt_logprobs=mine[0].prompt_logprobs)
            )
        return responses

    # ---- weight sync ----------------------------------------------------------------------

    def weight_names(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {n: (tuple(t.shape), t.dtype) for n, t in plain_tensors(self.model).items()}

    @remote_function(dispatch="all", collect="first")
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        copy_weights(self.model, weights)

    @remote_function(dispatch="all", collect="first")
    def load_lora(
        self, adapter_name: str, config: Mapping[str, Any], weights: Mapping[str, torch.Tensor]
    ) -> None:
        if adapter_name == BASE_MODEL:
            raise ValueError(f"{BASE_MODEL!r} names the base model; pick another adapter name")
        self.model = install_lora(self.model, adapter_name, config, weights).eval()
