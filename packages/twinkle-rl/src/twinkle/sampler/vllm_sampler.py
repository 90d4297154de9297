"""vLLMSampler: the TorchSampler interface on a vLLM engine (the optional extra ``vllm``).

vLLM pins its own torch and transformers, so it lives in its own environment
(``pip install 'twinkle-rl[vllm]'`` there) and is imported only when a vLLMSampler is built.
Without vLLM or without a GPU, construction fails at once with an error that says so. The
request and response conversions are ``twinkle.sampler.vllm_io`` (tested without vLLM); the
engine itself is checked by ``tests/gpu/check_vllm_sampler.py`` on a GPU.

Weight sync: ``load_weights`` hands tensors to the engine's own ``model.load_weights``;
``load_lora`` writes the adapter in peft's layout to a scratch folder and registers it as a
``LoRARequest`` under a new id each time, so vLLM reloads it. ``sleep``/``wake_up`` free and
restore the engine's GPU memory when trainer and sampler share a device (build the sampler
with ``engine_args={'enable_sleep_mode': True}``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from twinkle.data_format import SampleResponse
from twinkle.hub import resolve_model
from twinkle.infra import remote_class, remote_function
from twinkle.mesh import DeviceMesh
from twinkle.sampler.base import BASE_MODEL, Sampler, SampleRequest
from twinkle.sampler.prompts import as_prompt_features, check_sampling_params, prompt_token_ids
from twinkle.sampler.vllm_io import (
    generate_calls,
    to_sample_response,
    vllm_sampling_kwargs,
)
from twinkle.sampler.weights import plain_tensors
from twinkle.template import Template


def check_vllm_available() -> None:
    """Raise a clear error when this process cannot run a vLLM engine."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "vLLMSampler needs vLLM, which is not installed: pip install 'twinkle-rl[vllm]' "
            "in an environment with a GPU (vLLM pins its own torch), or use TorchSampler, "
            "which has the same interface and runs anywhere"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            "vLLMSampler needs a CUDA GPU and this process sees none; use TorchSampler on a "
            "CPU (same interface: a one-word change)"
        )


@remote_class(execute="all")
class vLLMSampler(Sampler):  # noqa: N801 - the documents' name
    """Samples with a vLLM ``LLM`` built from ``model_id`` and ``engine_args``; its
    requests run on the ``LLM``'s engine step by step, so tokens stream as they are drawn."""

    streams_tokens = True

    def __init__(
        self,
        model_id: str | os.PathLike,
        *,
        engine_args: Mapping[str, Any] | None = None,
        device_mesh: DeviceMesh | None = None,
        seed: int = 0,
    ) -> None:
        check_vllm_available()
        from vllm import LLM

        self.model_id = str(model_id)
        self.device_mesh = device_mesh
        self.template: Template | None = None
        self._folder = resolve_model(self.model_id)
        self.engine = LLM(model=str(self._folder), seed=seed, **dict(engine_args or {}))
        self._lora: dict[str, Any] = {}
        self._lora_loads = 0
        self._lora_dir = Path(tempfile.mkdtemp(prefix="twinkle-vllm-lora-"))

    @remote_function(dispatch="all", collect="first")
    def sample_many(
        self, requests: Sequence[SampleRequest]
    ) -> list[list[SampleResponse] | Exception]:
        """Several ``sample`` calls, of any adapters and params, run together on the engine
        (``vllm_io.generate_calls``), each request's ``on_token`` hearing its tokens as vLLM
        draws them: each call's responses, or the exception that refused it alone (an unknown
        adapter, bad params, a prompt the engine would not take), in order."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.sampling_params import RequestOutputKind

        def make_params(kwargs: Mapping[str, Any]) -> Any:
            return VLLMSamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)

        template = self._template()
        stops = sorted(self._stop_token_ids(template))
        outcomes: dict[int, Any] = {}
        calls = []
        for index, request in enumerate(requests):
            try:
                params = check_sampling_params(request.sampling_params, request.num_samples)
                prompts = as_prompt_features(request.inputs, template)
                ids = [prompt_token_ids(p) for p in prompts]
                lora = self._lora_request(request.adapter_name)
                calls.append((index, prompts, ids, params, lora, request.on_token))
            except Exception as exc:  # noqa: BLE001 - this call's refusal, handed back
                outcomes[index] = exc
        per_call = generate_calls(
            self.engine,
            [
                (ids, vllm_sampling_kwargs(params, stops), lora, on_token)
                for _, _, ids, params, lora, on_token in calls
            ],
            make_params,
        )
        for (index, prompts, ids, params, *_), outputs in zip(calls, per_call, strict=True):
            if isinstance(outputs, Exception):
                outcomes[index] = outputs
                continue
            try:
                outcomes[index] = [
                    to_sample_response(output, prompt, prompt_ids, params)
                    for output, prompt, prompt_ids in zip(outputs, prompts, ids, strict=True)
                ]
            except Exception as exc:  # noqa: BLE001 - this call's failure alone
                outcomes[index] = exc
        return [outcomes[i] for i in range(len(requests))]

    def vocab_size(self) -> int:
        """Rows of the model's vocabulary (token ids at or above it are not the model's)."""
        return int(self.engine.llm_engine.model_config.get_vocab_size())

    def _lora_request(self, adapter_name: str | None) -> Any:
        if adapter_name == BASE_MODEL:
            return None
        if adapter_name is None:
            return self._lora.get("default") or next(iter(self._lora.values()), None)
        if adapter_name not in self._lora:
            raise ValueError(
                f"the sampler has no adapter {adapter_name!r}; it has {list(self._lora)}"
            )
        return self._lora[adapter_name]

    @remote_function(dispatch="all", collect="first")
    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

    @remote_function(dispatch="all", collect="first")
    def sleep(self, level: int = 1) -> None:
        """Free the engine's GPU memory (level 1 keeps the weights in CPU memory)."""
        self.engine.sleep(level=level)

    @remote_function(dispatch="all", collect="first")
    def wake_up(self) -> None:
        self.engine.wake_up()

    # ---- weight sync ----------------------------------------------------------------------

    def _model(self) -> torch.nn.Module:
        """The engine's torch module (in-process engine: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""
        try:
            executor = self.engine.llm_engine.model_executor
            return executor.driver_worker.worker.model_runner.model
        except AttributeError as err:
            raise RuntimeError(
                "cannot reach the vLLM engine's model in this process: build the sampler with "
                "VLLM_ENABLE_V1_MULTIPROCESSING=0 and tensor_parallel_size=1 for weight sync"
            ) from err

    def weight_names(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The Hugging Face names and shapes of the model (the names vLLM's ``load_weights``
        maps onto its fused layers), from the config on the meta device: no memory used."""
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(self._folder)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        return {n: (tuple(t.shape), t.dtype) for n, t in plain_tensors(skeleton).items()}

    @remote_function(dispatch="all", collect="first")
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self._model().load_weights(weights)

    @remote_function(dispatch="all", collect="first")
    def load_lora(
        self, adapter_name: str, config: Mapping[str, Any], weights: Mapping[str, torch.Tensor]
    ) -> None:
        from vllm.lora.request import LoRARequest

        if adapter_name == BASE_MODEL:
            raise ValueError(f"{BASE_MODEL!r} names the base model; pick another adapter name")
        self._lora_loads += 1  # a new id and folder each time, so vLLM loads the new tensors
        folder = self._lora_dir / f"{adapter_name}-{self._lora_loads}"
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text(json.dumps(dict(config)))
        tensors = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
        save_file(tensors, folder / "adapter_model.safetensors")
        self._lora[adapter_name] = LoRARequest(adapter_name, self._lora_loads, str(folder))
