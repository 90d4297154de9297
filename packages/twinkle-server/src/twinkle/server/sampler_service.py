"""The sampler service: completions from the base model or from a tenant's saved adapter.

It drives any ``twinkle.sampler.Sampler`` (TorchSampler on CPU, vLLMSampler on a GPU)
through the protocol's ``sample`` and ``load_lora``. ``adapter_uri`` names a checkpoint
the caller owns (``twinkle://<run>/weights/<name>``); its adapter is loaded into the
sampler once and kept in a small LRU cache of adapter slots (an evicted checkpoint's slot is
reused, so the sampler never holds more than ``max_cached_adapters`` adapters, and a folder
rewritten in place is loaded again). Sampling runs on its own worker, one lane per key, so
samplers and trainers do not wait on each other; keys' requests waiting together are
sampled as one batch (``run_many``: the sampler's ``sample_many``, each row through its own
checkpoint's adapter, each request from its own seed). ``sample_tokens`` is the token-level
entry of the Tinker routes.
"""

from __future__ import annotations

import json
import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle.data_format import InputFeature, SampleResponse, SamplingParams
from twinkle.model.unit_random import derived_seed
from twinkle.sampler.base import BASE_MODEL, SampleRequest
from twinkle.server.auth import Principal
from twinkle.server.config import ServerConfig
from twinkle.server.errors import BadRequest, NotFound
from twinkle.server.limits import check_num_samples, check_sequences
from twinkle.server.sampling_params import check_sampling_values
from twinkle.server.scheduler import Batchable, FairWorker
from twinkle.server.wire import check_allowed, decode_inputs, template_kwargs
from twinkle.utils import get_logger

logger = get_logger()
DEFAULT_TEMPLATE: tuple[str, dict[str, Any]] = ("Template", {})
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def build_sampler(config: ServerConfig) -> Any:
    """The configured sampler, or None (logged) when its package is not installed yet."""
    try:
        if config.sampler.kind == "vllm":
            from twinkle.sampler import vLLMSampler as cls
        else:
            from twinkle.sampler import TorchSampler as cls
    except ImportError as exc:
        logger.warning(f"sampler {config.sampler.kind!r} is not available ({exc}): sampling is off")
        return None
    # vLLMSampler hands engine_args to vLLM's engine; TorchSampler logs them as ignored.
    kwargs: dict[str, Any] = {"engine_args": dict(config.sampler.engine_args)}
    if config.model.device is not None and config.sampler.kind == "torch":
        kwargs.setdefault("device", config.model.device)
    kwargs.setdefault("seed", config.model.seed)
    if config.mode == "ray":
        kwargs["remote_group"] = config.sampler.remote_group
    return cls(config.model.model_id, **kwargs)


class SamplerService:
    def __init__(self, config: ServerConfig, model_service: Any, sampler: Any = None) -> None:
        self.config = config
        self.model_service = model_service
        self.sampler = sampler if sampler is not None else build_sampler(config)
        self.available = self.sampler is not None
        # One batch of several keys' samples holds at most the adapters the cache keeps.
        self.worker = FairWorker(
            "sampler",
            max_items=config.sampler.max_cached_adapters,
            linger_s=config.model.batching.linger_ms / 1e3,
        )
        # checkpoint folder -> (its weights' mtime, the sampler's adapter slot holding them)
        self._adapters: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._templates: dict[str, tuple[str, dict[str, Any]]] = {}  # key id -> template
        self._current_template: tuple[str, dict[str, Any]] | None = None
        self._vocab_size: int | None = None
        self._seed_streams: dict[str, random.Random] = {}  # key id -> its unseeded calls' seeds
        # mode ray: the TokenRelay of streamed samples. Made now: its queue is a Ray actor,
        # whose start (1.3 s measured under Serve) the first stream would otherwise wait for.
        self._relay: Any = None
        if config.mode == "ray" and self.available:
            from twinkle.server.token_relay import TokenRelay

            self._relay = TokenRelay()

    def set_template(self, principal: Principal, body: dict[str, Any]) -> None:
        """Record the caller's template; it is applied before each of the caller's samples
        (the sampler holds one template: a batch samples the requests of each in turn)."""
        name = check_allowed(body.get("template"), self.config.allow.templates, "template")
        kwargs = template_kwargs(body.get("kwargs"), name, self.config.model.model_id)
        self._templates[principal.key_id] = (name, kwargs)

    def prepare(self, principal: Principal, body: dict[str, Any]):
        """Check the request now (4xx before queueing); return the work to run on the worker."""
        limits = self.config.limits
        batch = decode_inputs(body.get("inputs"), limits)
        raw = body.get("sampling_params") or {}
        if not isinstance(raw, dict):
            raise BadRequest("sampling_params must be an object")
        num_samples = body.get("num_samples")
        if num_samples is not None:
            check_num_samples(num_samples, limits)
        if raw.get("num_samples") is not None:
            check_num_samples(raw["num_samples"], limits, "sampling_params.num_samples")
        check_sampling_values(raw, self.config.sampler.max_tokens, self.vocab_size())
        try:
            params = SamplingParams.model_validate({"max_tokens": 64, **raw})
        except ValueError as exc:
            raise BadRequest(f"invalid sampling_params: {exc}") from None
        per_prompt = num_samples if num_samples is not None else params.num_samples
        check_sequences(len(batch), per_prompt, limits)
        if params.seed is None:
            params = params.model_copy(update={"seed": self.next_seed(principal.key_id)})
        folder = None
        if body.get("adapter_uri") is not None:
            folder = self.model_service.owned_checkpoint(principal, body["adapter_uri"]).path

        template = self._templates.get(principal.key_id, DEFAULT_TEMPLATE)
        return SampleJob(self, template, folder, batch, params, num_samples)

    def batchable(self, job: SampleJob) -> Batchable | None:
        """The job as an item of a batch shared with other keys' samples (``run_many``), or
        None when batching is off or the sampler runs on Ray workers."""
        if not self.config.model.batching.enabled or self.config.mode == "ray":
            return None
        return Batchable("sample", job, self.run_many, rows=len(job.batch))

    def run_many(self, jobs: list[SampleJob]) -> list[Any]:
        """Several keys' samples as ``sample_many`` calls, one per template (the sampler
        holds one at a time): each job's answer, or the error that refused it alone. A batch
        holds at most ``max_cached_adapters`` jobs, so loading one's adapter never evicts
        another's of the same batch."""
        answers: dict[int, Any] = {}
        by_template: list[tuple[tuple[str, dict[str, Any]], list[int]]] = []
        for index, job in enumerate(jobs):
            group = next((g for t, g in by_template if t == job.template), None)
            if group is None:
                by_template.append((job.template, group := []))
            group.append(index)
        for template, indices in by_template:
            self._use_template(template)
            ready = []
            for index in indices:
                job = jobs[index]
                try:
                    adapter = self._adapter(job.folder) if job.folder is not None else BASE_MODEL
                except Exception as exc:  # noqa: BLE001 - this job's answer
                    answers[index] = exc
                    continue
                ready.append(
                    (index, SampleRequest(job.batch, job.params, adapter, job.num_samples))
                )
            outcomes = self.sampler.sample_many([request for _, request in ready])
            for (index, _), outcome in zip(ready, outcomes, strict=True):
                answers[index] = outcome if isinstance(outcome, Exception) else answer(outcome)
        return [answers[index] for index in range(len(jobs))]

    def next_seed(self, key_id: str) -> int:
        """The seed of a call that names none, from the key's own generator (seeded by the
        model's seed and the key): a tenant's unseeded samples follow its own calls alone, not
        how many other tenants sampled in between (the sampler's one generator would)."""
        stream = self._seed_streams.get(key_id)
        if stream is None:
            seed = derived_seed(self.config.model.seed, key_id, "sampling")
            stream = self._seed_streams[key_id] = random.Random(seed)
        return stream.getrandbits(63)

    def vocab_size(self) -> int | None:
        """Token ids at or above this are not the model's (checked before queueing); None
        when the sampler runs elsewhere (mode: ray) and the check is left to it."""
        if self._vocab_size is None and self.config.mode != "ray":
            self._vocab_size = int(self.sampler.vocab_size())
        return self._vocab_size

    @property
    def streams_tokens(self) -> bool:
        """Whether ``sample_tokens``'s ``on_token`` hears tokens as they are drawn (a sampler
        that streams, in this process or on a Ray group through ``token_relay``; else the
        work simply returns the whole sample)."""
        if self.config.mode == "ray":  # both samplers stream: their tokens come relayed
            return True
        return bool(getattr(self.sampler, "streams_tokens", False))

    def sample_tokens(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        folder: str | None,
        on_token: Callable[[int, int, Any], None] | None = None,
    ) -> Callable[[], SampleResponse]:
        """The work of one token prompt (the caller checked it), sampled from the base model
        or from the adapter saved in ``folder``; runs on the worker. ``on_token(row, token,
        logprob pairs)`` hears each token as it is drawn where ``streams_tokens``."""
        prompt = InputFeature(input_ids=prompt_ids)

        def work() -> SampleResponse:
            return self._sample(DEFAULT_TEMPLATE, folder, [prompt], params, None, on_token)[0]

        return work

    def _sample(
        self,
        template: tuple[str, dict[str, Any]],
        folder: str | None,
        batch: list,
        params: SamplingParams,
        num_samples: int | None,
        on_token: Callable[[int, int, Any], None] | None = None,
    ) -> list[SampleResponse]:
        self._use_template(template)
        # The base model explicitly: with adapters loaded, None would pick one of them.
        adapter = self._adapter(folder) if folder is not None else BASE_MODEL
        if on_token is None or not self.streams_tokens:
            return self.sampler.sample(batch, params, adapter_name=adapter, num_samples=num_samples)
        if self.config.mode == "ray":
            request = SampleRequest(batch, params, adapter, num_samples, self._relay.listener(0))
            relay = self._relay.relay
            outcome = relay({0: on_token}, lambda: self.sampler.sample_many([request])[0])
        else:
            request = SampleRequest(batch, params, adapter, num_samples, on_token)
            outcome = self.sampler.sample_many([request])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _use_template(self, template: tuple[str, dict[str, Any]]) -> None:
        if template != self._current_template:
            name, kwargs = template
            self.sampler.set_template(name, **kwargs)
            self._current_template = template

    def _adapter(self, folder: str) -> str:
        """The sampler's name for a checkpoint's adapter, loading it on first use (and again
        when the folder's weights were rewritten since)."""
        path = Path(folder)
        try:
            mtime = (path / ADAPTER_WEIGHTS).stat().st_mtime_ns
        except FileNotFoundError:
            raise NotFound("the checkpoint to sample from no longer exists") from None
        cached = self._adapters.get(folder)
        if cached is not None and cached[0] == mtime:
            self._adapters.move_to_end(folder)
            return cached[1]
        from safetensors.torch import load_file

        config = json.loads((path / "adapter_config.json").read_text())
        weights = load_file(str(path / ADAPTER_WEIGHTS))
        if cached is not None:
            name = cached[1]
        elif len(self._adapters) >= self.config.sampler.max_cached_adapters:
            _, (_, name) = self._adapters.popitem(last=False)  # its slot takes the new weights
        else:
            used = {slot for _, slot in self._adapters.values()}
            name = next(f"ckpt{i}" for i in range(len(used) + 1) if f"ckpt{i}" not in used)
        self.sampler.load_lora(name, config, weights)
        self._adapters[folder] = (mtime, name)
        self._adapters.move_to_end(folder)
        return name

    def stop(self) -> None:
        self.worker.stop()


def answer(responses: list[SampleResponse]) -> dict[str, Any]:
    """A sample request's JSON result: every sequence, and the responses per prompt."""
    per_prompt = [r.to_dict() for r in responses]
    flat = [seq for r in per_prompt for seq in r["sequences"]]
    return {"sequences": flat, "responses": per_prompt}


@dataclass(frozen=True)
class SampleJob:
    """A checked ``/twinkle/sampler/sample`` request: called, it samples alone on the
    worker; as a ``Batchable`` item it shares ``SamplerService.run_many`` with others."""

    service: SamplerService
    template: tuple[str, Any]
    folder: str | None
    batch: list
    params: SamplingParams
    num_samples: int | None

    def __call__(self) -> dict[str, Any]:
        responses = self.service._sample(
            self.template, self.folder, self.batch, self.params, self.num_samples
        )
        return answer(responses)
