"""The training work of Tinker requests, run on the model's worker in the run's lane.

Tinker's losses are token-level SUMS and its optimizer step applies the gradient of that
sum as it is, while a Twinkle model divides the accumulated gradients by the step's token
count. A Tinker step is therefore the model's ``step_with(normalise=False)``, which also
takes the learning rate, betas, eps, weight decay and clip norm that come with each
optim_step request (Tinker's ``AdamParams``).

LoRA goes where ``train_attn``/``train_mlp``/``train_unembed`` say (``lm_head`` for the
last). NOTE: peft then saves the whole output embedding with each adapter (it treats
``lm_head`` as an embedding layer), which is large on a real model; a client that does not
need it passes ``train_unembed=False``.

Everything here goes through the model's remote functions, so it runs the same whether the
model is in this process (``mode: embedded``) or on a Ray group (``mode: ray``/``http``).
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from peft import LoraConfig

from twinkle.model.transformers.tenant_pass import TenantRequest
from twinkle.server.checks import INT64_MAX, integer, number, refuse_nulls
from twinkle.server.errors import BadRequest
from twinkle.server.names import CheckpointUri
from twinkle.server.scheduler import Batchable
from twinkle.server.tinker.batch import per_datum_logprobs

ADAM_DEFAULTS = {
    "learning_rate": 1e-4,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-12,
    "weight_decay": 0.0,
    "grad_clip_norm": 0.0,
}
# eps > 0: with eps 0 a parameter whose gradient is zero steps by 0/0 = NaN.
ADAM_BOUNDS: dict[str, dict[str, Any]] = {
    "learning_rate": {"low": 0, "low_open": True},
    "beta1": {"low": 0, "high": 1, "high_open": True},
    "beta2": {"low": 0, "high": 1, "high_open": True},
    "eps": {"low": 0, "low_open": True},
    "weight_decay": {"low": 0},
    "grad_clip_norm": {"low": 0},
}
KEEP_EPHEMERAL = 8
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
UNEMBED = ["lm_head"]
LORA_KEYS = {"rank", "seed", "train_attn", "train_mlp", "train_unembed"}


def tinker_lora_config(raw: Any, max_rank: int) -> tuple[LoraConfig, int | None]:
    """A LoraConfig from Tinker's ``{rank, seed?, train_attn, train_mlp, train_unembed}``,
    and the seed its weights start from."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadRequest("lora_config must be an object")
    unknown = set(raw) - LORA_KEYS
    if unknown:  # lora_alpha, dropout...: Tinker does not take them, so none is ignored
        raise BadRequest(f"lora_config keys {sorted(unknown)} are unknown; use {sorted(LORA_KEYS)}")
    rank = integer(raw.get("rank", 32), "lora_config.rank", 1, max_rank)
    targets: list[str] = []
    flags = (("train_attn", ATTENTION), ("train_mlp", MLP), ("train_unembed", UNEMBED))
    for flag, modules in flags:
        value = raw.get(flag, True)
        if not isinstance(value, bool):
            raise BadRequest(f"lora_config.{flag} must be a bool, got {value!r}")
        if value:
            targets += modules
    if not targets:
        raise BadRequest("lora_config trains nothing: set train_attn, train_mlp or train_unembed")
    seed = raw.get("seed")
    if seed is not None:
        integer(seed, "lora_config.seed", 0, INT64_MAX)
    return LoraConfig(r=rank, lora_alpha=32, target_modules=targets), seed


def adam_params(raw: Any) -> dict[str, float]:
    """Tinker's AdamParams with every default filled in (SDK 0.16.1 sends only those set;
    a null is a NaN or an infinity the SDK could not write)."""
    if not isinstance(raw, dict):
        raise BadRequest("optim_step needs adam_params, an object with learning_rate etc.")
    unknown = set(raw) - set(ADAM_DEFAULTS)
    if unknown:
        raise BadRequest(
            f"adam_params keys {sorted(unknown)} are unknown; use {list(ADAM_DEFAULTS)}"
        )
    refuse_nulls(raw, ADAM_DEFAULTS, "adam_params")
    params = {**ADAM_DEFAULTS, **raw}
    return {
        key: number(params[key], f"adam_params.{key}", **bounds)
        for key, bounds in ADAM_BOUNDS.items()
    }


def prepare_run(service: Any, adapter: str) -> None:
    """A new Tinker run's optimizer (AdamW; each step sets its hyperparameters)."""
    service.model.set_optimizer("AdamW", adapter_name=adapter, lr=ADAM_DEFAULTS["learning_rate"])


def forward_backward(
    service: Any,
    adapter: str,
    batch: dict[str, torch.Tensor],
    loss_inputs: dict[str, torch.Tensor],
    lengths: list[int],
    loss: Any,
    forward_only: bool,
) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
    """Run a batch from ``batch.build_batch``; returns per-datum ``{"logprobs": array}`` and
    the metrics (``loss:sum``: the Tinker loss summed over the request's tokens).

    On data-parallel workers each runs its share of the rows and the model returns the
    whole batch's output (its ``collect='rows'``): every row's logps in datum order and the
    loss over all the tokens, and the gradients their reduction sums are those of the whole
    batch's loss sum (see ``optim_step``). ``loss:sum`` is the Tinker loss of every row's
    logps: the model's own loss would add a MoE's router loss."""
    model = service.model
    model.set_loss(loss, adapter_name=adapter)
    run = model.forward_only if forward_only else model.forward_backward
    logps = run(batch, adapter_name=adapter, **loss_inputs)["logps"]
    return _tinker_outputs(TinkerPass(None, batch, loss_inputs, lengths, loss), logps)


@dataclass(frozen=True)
class TinkerPass:
    """A Tinker forward_backward (or forward) as an item of a pass shared with other runs'
    of the same kind."""

    live: Any
    batch: dict[str, torch.Tensor]
    loss_inputs: dict[str, torch.Tensor]
    lengths: list[int]
    loss: Any
    forward_only: bool = False


def _tinker_outputs(item: TinkerPass, logps: Any) -> tuple[list[dict[str, np.ndarray]], dict]:
    with torch.no_grad():
        loss_sum = float(item.loss(item.batch, {"logps": logps}, **item.loss_inputs)["loss"])
    outputs = [{"logprobs": row} for row in per_datum_logprobs(logps, item.lengths)]
    return outputs, {"loss:sum": loss_sum}


def batchable(service: Any, item: TinkerPass, encode: Any) -> Batchable | None:
    """The forward_backward (or forward) as a ``Batchable`` of the model's worker (its answer
    encoded by ``encode(outputs, metrics)``), or None where the Twinkle routes' would run
    alone."""
    if not service.config.model.batching.enabled or service.workers > 1:
        return None
    return Batchable(
        "tinker_forward" if item.forward_only else "tinker_forward_backward",
        item,
        lambda items: run_many(service, items, encode),
        rows=len(item.lengths),
    )


def run_many(service: Any, items: list[TinkerPass], encode: Any) -> list[Any]:
    """Several runs' Tinker forward_backward calls as one ``forward_backward_many`` pass (or
    forward calls as one ``forward_only_many``): each call's encoded answer, or the error
    that refused it alone. The items of one pass are of one kind (``batchable``)."""
    answers: dict[int, Any] = {}
    ready: list[tuple[int, TinkerPass]] = []
    for index, item in enumerate(items):
        try:
            service.run_for(item.live, lambda: None)  # the run still holds its slot
            service.model.set_loss(item.loss, adapter_name=item.live.adapter)
            ready.append((index, item))
        except Exception as exc:  # noqa: BLE001 - this call's answer
            answers[index] = exc
    requests = [TenantRequest(i.live.adapter, i.batch, i.loss_inputs) for _, i in ready]
    model = service.model
    run_pass = model.forward_only_many if items[0].forward_only else model.forward_backward_many
    outcomes = run_pass(requests)
    for (index, item), outcome in zip(ready, outcomes, strict=True):
        if isinstance(outcome, Exception):
            answers[index] = outcome
        else:
            answers[index] = encode(*_tinker_outputs(item, outcome["logps"]))
    return [answers[index] for index in range(len(items))]


def save_ephemeral(service: Any, principal: Any, live: Any, sampling_seq: int) -> str:
    """The run's adapter in a folder of its own for one sampling session; not a checkpoint
    (unlisted, never resumed from). Returns the folder."""
    uri = CheckpointUri(live.run.id, "sampler_weights", f"ephemeral-{sampling_seq}")
    parent = service.checkpoint_folder(principal.key_id, uri).parent.parent / "ephemeral"
    parent.mkdir(parents=True, exist_ok=True)
    folder = service.model.save(uri.name, parent, adapter_name=live.adapter, save_optimizer=False)
    # An RL loop saves one per step: keep the few its sampling clients may still be loading.
    older = sorted(parent.glob("ephemeral-*"), key=lambda p: p.stat().st_mtime)
    for stale in older[:-KEEP_EPHEMERAL]:
        shutil.rmtree(stale, ignore_errors=True)
    return folder


def optim_step(service: Any, adapter: str, params: dict[str, float]) -> dict[str, float]:
    """One AdamW step on the summed gradients (see the module docstring); returns what the
    step did, as floats: the learning rate it applied, and the
    gradient's global norm before clipping and after (the same when it was not clipped:
    ``grad_clip_norm`` 0 measures the norm without clipping)."""
    clip = params["grad_clip_norm"]
    norm = service.model.step_with(
        adapter_name=adapter,
        optimizer_params={
            "lr": params["learning_rate"],
            "betas": (params["beta1"], params["beta2"]),
            "eps": params["eps"],
            "weight_decay": params["weight_decay"],
        },
        max_grad_norm=clip if clip > 0 else math.inf,
        normalise=False,
    )
    clipped = min(norm, clip) if clip > 0 else norm
    return {
        "learning_rate:mean": params["learning_rate"],
        "grad_norm:mean": float(norm),
        "grad_norm_clipped:mean": float(clipped),
    }
