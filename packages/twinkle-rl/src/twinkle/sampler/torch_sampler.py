"""TorchSampler: sampling with the model's own forward and KV cache, on any device torch has.

The sampler to test an RL loop on a CPU, and the reference vLLMSampler is checked against.
It holds its own copy of the model, as vLLM does, and receives the trainer's weights through
``CheckpointEngineManager``. No prefix cache, no continuous batching: the prompts of one call
are generated together, ``max_batch_size`` rows at a time; ``sample_many`` generates several
calls' rows together, each row through its own call's LoRA adapter (peft's mixed-adapter
batches), as vLLM batches its multi-LoRA requests.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from peft import PeftModel

from twinkle.data_format import SampleResponse, SamplingParams
from twinkle.infra import remote_class, remote_function
from twinkle.mesh import DeviceMesh, Platform
from twinkle.model.transformers.loading import load_causal_lm
from twinkle.sampler.base import BASE_MODEL, Sampler, SampleRequest
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


@dataclass
class _Prepared:
    """One ``sample`` call checked and encoded: what its rows need to be generated."""

    prompts: list
    prompt_ids: list[list[int]]
    params: SamplingParams
    stop: StopRule
    seed: int
    adapter: str | None  # the peft adapter, BASE_MODEL, or None (no adapters loaded)
    on_token: Any = None  # the request's SampleRequest.on_token


def _calls_on_token(group: list[_Prepared], part: list[tuple[int, int, int]]):
    """One chunk's token callback: chunk row i is (call, prompt, sample) ``part[i]``, handed
    to that call's ``on_token`` as the call's own row ``prompt * num_samples + sample``."""
    if all(call.on_token is None for call in group):
        return None

    def heard(row: int, token: int, pairs: Any) -> None:
        c, p, s = part[row]
        call = group[c]
        if call.on_token is not None:
            call.on_token(p * call.params.num_samples + s, token, pairs)

    return heard


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

    streams_tokens = True

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

    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    # ---- sampling -------------------------------------------------------------------------

    @remote_function(dispatch="all", collect="first")
    def sample_many(
        self, requests: Sequence[SampleRequest]
    ) -> list[list[SampleResponse] | Exception]:
        """Several ``sample`` calls, possibly of different adapters, batched: the rows of calls
        whose sampling params match (all but the seed and the sample count) are generated
        together, each row through its own call's adapter (peft's mixed-adapter batches,
        ``adapter_names=``) and from its own call's seed, so each call gets what it gets
        alone up to the rounding of larger matmuls. A call refused (an unknown adapter, bad
        params) gets its exception; the others run."""
        outcomes: dict[int, list[SampleResponse] | Exception] = {}
        groups: dict[str, list[tuple[int, _Prepared]]] = {}
        for index, request in enumerate(requests):
            try:
                prepared = self._prepare(request)
            except Exception as exc:  # noqa: BLE001 - this call's refusal, handed back
                outcomes[index] = exc
                continue
            key = prepared.params.model_dump_json(exclude={"seed", "num_samples"})
            groups.setdefault(key, []).append((index, prepared))
        for group in groups.values():
            results = self._generate_group([prepared for _, prepared in group])
            outcomes.update(zip((i for i, _ in group), results, strict=True))
        return [outcomes[i] for i in range(len(requests))]

    def _prepare(self, request: SampleRequest) -> _Prepared:
        params = check_sampling_params(request.sampling_params, request.num_samples)
        template = self._template()
        prompts = as_prompt_features(request.inputs, template)
        seed = (
            params.seed
            if params.seed is not None
            else int(torch.randint(2**62, (1,), generator=self._generator))
        )
        stop = StopRule.build(params, () if params.ignore_eos else self._stop_token_ids(template))
        adapter = self._adapter_for(request.adapter_name)
        ids = [prompt_token_ids(p) for p in prompts]
        return _Prepared(prompts, ids, params, stop, seed, adapter, request.on_token)

    def _adapter_for(self, adapter_name: str | None) -> str | None:
        """The peft adapter a call's rows run through (``BASE_MODEL`` for the base model),
        or None when the sampler holds no adapters."""
        if adapter_name == BASE_MODEL:
            return BASE_MODEL
        if not isinstance(self.model, PeftModel):
            if adapter_name is not None:
                raise ValueError(
                    f"the sampler has no adapter {adapter_name!r}: sync one with "
                    "CheckpointEngineManager(model, sampler).sync_weights(merge_and_sync=False)"
                )
            return None
        names = list(self.model.peft_config)
        if adapter_name is None:
            return "default" if "default" in names else names[0]
        if adapter_name not in names:
            raise ValueError(f"the sampler has no adapter {adapter_name!r}; it has {names}")
        return adapter_name

    def _generate_group(self, group: list[_Prepared]) -> list[list[SampleResponse]]:
        """Generate every row of calls that share their sampling params, in chunks of
        ``max_batch_size`` rows."""
        params, stop, template = group[0].params, group[0].stop, self._template()
        rows = [
            (c, p, s)
            for c, call in enumerate(group)
            for p in range(len(call.prompts))
            for s in range(call.params.num_samples)
        ]
        chunk = self.max_batch_size or len(rows)
        results = []
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            adapters = [group[c].adapter for c, _, _ in part]
            generators = [
                torch.Generator(self.device).manual_seed(row_seed(group[c].seed, p, s))
                for c, p, s in part
            ]
            with self._routing(adapters) as model_kwargs:
                results += generate(
                    self.model,
                    [group[c].prompt_ids[p] for c, p, _ in part],
                    params,
                    generators,
                    stop,
                    template.tokenizer.decode,
                    template.tokenizer.pad_token_id or 0,
                    self.device,
                    model_kwargs,
                    _calls_on_token(group, part),
                )
        responses, start = [], 0
        for call in group:
            stop_at = start + len(call.prompts) * call.params.num_samples
            responses.append(self._responses(call, results[start:stop_at], template))
            start = stop_at
        return responses

    @contextmanager
    def _routing(self, adapters: list[str | None]) -> Iterator[dict[str, Any]]:
        """The model set up for rows of ``adapters``: one adapter made active (or disabled,
        for the base model), or, for several, peft's per-row ``adapter_names``."""
        if len(set(adapters)) > 1:
            yield {"adapter_names": adapters}
            return
        adapter = adapters[0]
        if adapter is None:
            yield {}
        elif adapter == BASE_MODEL:
            with (
                self.model.disable_adapter() if isinstance(self.model, PeftModel) else nullcontext()
            ):
                yield {}
        else:
            self.model.set_adapter(adapter)
            yield {}

    def _responses(
        self, call: _Prepared, results: list, template: Template
    ) -> list[SampleResponse]:
        responses = []
        n = call.params.num_samples
        for p, prompt in enumerate(call.prompts):
            mine = results[p * n : (p + 1) * n]
            sequences = [
                sampled_sequence(
                    prompt,
                    call.prompt_ids[p],
                    r.tokens,
                    r.logprobs,
                    r.stop_reason,
                    call.stop.cut_text(template.decode(r.tokens, skip_special_tokens=True)),
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
