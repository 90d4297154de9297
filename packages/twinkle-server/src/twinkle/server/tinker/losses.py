"""Tinker's built-in losses as Twinkle losses, as the public Tinker docs define them.

With ``logp`` the trained policy's log-probability of each target token, ``q`` the
sampler's (``loss_fn_inputs['logprobs']``), ``A`` the advantages, ``w`` the weights and
``r = exp(logp - q)``, each loss is a SUM over every target token of the request (never a
mean, so a chunked batch trains like one call):

* ``cross_entropy``        ``-sum w * logp``; weights may be any real number (client-side
  custom losses send ``-dC/dlogp``);
* ``importance_sampling``  ``-sum r * A``;
* ``ppo``                  ``-sum min(r * A, clip(r, low, high) * A)``;
* ``cispo``                ``-sum stop_grad(clip(r, low, high)) * logp * A``;
* ``dro``                  ``-sum (logp * A - beta / 2 * (logp - q) ** 2)``.

``low``/``high`` are ``clip_low_threshold``/``clip_high_threshold`` of ``loss_fn_config``
(0.8 and 1.2 when absent); ``dro`` needs ``beta``. Any other loss name or config key is a
user error: nothing is silently replaced.

A loss is called like every Twinkle loss, ``loss(inputs, outputs, **loss_inputs)``, with
``inputs['labels']`` (B, T), the policy's ``logps`` (or logits) in ``outputs``, and the
datum's other inputs as (B, T) keyword tensors aligned with the labels (zero off them).
``num_tokens`` reports the target tokens for metrics only: the Tinker optimizer step
applies the gradient of the sum as it is (see ``model_ops.optim_step``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import torch

from twinkle.loss import Loss, LossInputs, clipped_objective
from twinkle.loss.fields import count_label_tokens, label_mask, outputs_device, token_labels
from twinkle.loss.logps import token_logps
from twinkle.model.loss_keywords import unknown_keywords
from twinkle.server.errors import BadRequest

CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
REQUIRED = None  # a config key without a default


class TinkerLoss(Loss):
    """A token-level Tinker loss: ``per_token`` gives each target token's term."""

    name: ClassVar[str]
    reads: ClassVar[LossInputs]  # loss_fn_inputs besides target_tokens
    config_defaults: ClassVar[dict[str, float | None]] = {}

    def __init__(self, **config: Any) -> None:
        unknown = set(config) - set(self.config_defaults)
        if unknown:
            accepted = sorted(self.config_defaults) or "none"
            raise BadRequest(
                f"loss_fn_config keys {sorted(unknown)} are not accepted by {self.name!r}; "
                f"it takes: {accepted}"
            )
        values: dict[str, float] = {}
        for key, default in self.config_defaults.items():
            value = config.get(key, default)
            if value is REQUIRED:
                raise BadRequest(f"{self.name!r} needs loss_fn_config[{key!r}]")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadRequest(f"loss_fn_config[{key!r}] must be a number, got {value!r}")
            if not math.isfinite(value):
                raise BadRequest(f"loss_fn_config[{key!r}] must be finite, got {value}")
            values[key] = float(value)
        self.config = values
        self.check_config()

    def check_config(self) -> None:
        """Reject values the formula cannot take (override per loss)."""

    def check_inputs(self, names: Iterable[str]) -> None:
        """Refuse a ``loss_fn_inputs`` key this loss does not read, before the request is
        queued (the model would refuse it too, in the words of its own keywords)."""
        unknown = unknown_keywords(self.reads, names)
        if unknown:
            raise BadRequest(
                f"loss_fn_inputs {unknown.removeprefix('keyword ').removeprefix('keywords ')} "
                f"not read by {self.name!r}: it takes target_tokens and "
                f"{', '.join(self.reads.required)}"
            )

    def per_token(self, logps: torch.Tensor, values: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def _values(
        self, kwargs: Mapping[str, Any], labels: torch.Tensor, dtype: torch.dtype
    ) -> dict[str, torch.Tensor]:
        # A name the loss does not read was refused before the forward (check_loss_keywords).
        missing = set(self.reads.required) - {k for k, v in kwargs.items() if v is not None}
        if missing:
            raise BadRequest(
                f"{self.name!r} takes loss_fn_inputs target_tokens and "
                f"{', '.join(self.reads.required)}; missing {sorted(missing)}"
            )
        values = {}
        for name in self.reads.required:
            tensor = torch.as_tensor(kwargs[name], device=labels.device, dtype=dtype)
            if tensor.shape != labels.shape:
                raise BadRequest(
                    f"loss_fn_inputs[{name!r}] has shape {tuple(tensor.shape)}, labels "
                    f"{tuple(labels.shape)}: give one value per input token"
                )
            if not bool(torch.isfinite(tensor).all()):
                raise BadRequest(f"loss_fn_inputs[{name!r}] holds NaN or infinite values")
            values[name] = tensor
        return values

    def __call__(
        self, inputs: Mapping[str, Any], outputs: Mapping[str, Any], **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        owner = f"Tinker loss {self.name!r}"
        labels = token_labels(inputs, owner, outputs_device(outputs))
        mask = label_mask(labels)
        num_tokens = count_label_tokens(mask, owner)
        logps = token_logps(outputs, labels, owner=owner).logps
        values = self._values(kwargs, labels, torch.float32)
        per_token = self.per_token(logps.float(), values)
        loss = torch.where(mask, per_token, 0).sum()
        return {"loss": loss, "num_tokens": num_tokens}


def _ratio(logps: torch.Tensor, values: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.exp(logps - values["logprobs"])


class CrossEntropy(TinkerLoss):
    name, reads = "cross_entropy", LossInputs(required=("weights",))

    def per_token(self, logps, values):
        return -values["weights"] * logps


class ImportanceSampling(TinkerLoss):
    name, reads = "importance_sampling", LossInputs(required=("logprobs", "advantages"))

    def per_token(self, logps, values):
        return -_ratio(logps, values) * values["advantages"]


class _Clipped(TinkerLoss):
    reads = LossInputs(required=("logprobs", "advantages"))
    config_defaults = dict(CLIP_DEFAULTS)

    def check_config(self) -> None:
        low, high = self.config["clip_low_threshold"], self.config["clip_high_threshold"]
        if not 0 <= low <= high:
            raise BadRequest(
                f"{self.name!r} needs 0 <= clip_low_threshold <= clip_high_threshold, got "
                f"{low} and {high}"
            )

    def _clipped(self, ratio: torch.Tensor) -> torch.Tensor:
        return ratio.clamp(self.config["clip_low_threshold"], self.config["clip_high_threshold"])


class PPO(_Clipped):
    """PPOLoss's surrogate (``twinkle.loss.clipped_objective``) with Tinker's thresholds."""

    name = "ppo"

    def per_token(self, logps, values):
        low, high = self.config["clip_low_threshold"], self.config["clip_high_threshold"]
        return -clipped_objective(_ratio(logps, values), values["advantages"], low, high)


class CISPO(_Clipped):
    name = "cispo"

    def per_token(self, logps, values):
        weight = self._clipped(_ratio(logps, values)).detach()
        return -weight * logps * values["advantages"]


class DRO(TinkerLoss):
    name, reads = "dro", LossInputs(required=("logprobs", "advantages"))
    config_defaults = {"beta": REQUIRED}

    def check_config(self) -> None:
        if self.config["beta"] < 0:
            raise BadRequest(f"'dro' needs beta >= 0, got {self.config['beta']}")

    def per_token(self, logps, values):
        penalty = 0.5 * self.config["beta"] * (logps - values["logprobs"]).square()
        return -(logps * values["advantages"] - penalty)


TINKER_LOSSES: dict[str, type[TinkerLoss]] = {
    cls.name: cls for cls in (CrossEntropy, ImportanceSampling, PPO, CISPO, DRO)
}


def build_tinker_loss(name: Any, config: Mapping[str, Any] | None = None) -> TinkerLoss:
    """The Tinker loss ``name`` with its ``loss_fn_config``; a user error for anything else."""
    cls = TINKER_LOSSES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise BadRequest(
            f"loss_fn {name!r} is not supported by this server; use one of "
            f"{', '.join(TINKER_LOSSES)} (forward_backward_custom works with any of them)"
        )
    return cls(**dict(config or {}))
