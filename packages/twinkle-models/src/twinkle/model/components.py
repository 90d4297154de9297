"""What every backend does the same with its trainable units (TrainStates).

A mixin of TransformersModel and MegatronModel: resolving ``adapter_name`` to a unit,
setting the unit's loss, template, processor and metrics, turning inputs into a batch,
and the gradient-accumulation rhythm of ``clip_grad_and_step`` (with the default optimizer
of ``default_optimizer.py`` for a unit stepped before ``set_optimizer``). The backend
supplies the mechanics these call on: ``set_optimizer``, ``_clip``, ``_step``,
``_zero_grad``, ``_require_optimizer`` and ``_pad_token_id``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from twinkle.data_format import sampled_input_features
from twinkle.infra import WirePolicy, remote_function
from twinkle.loss import build_loss
from twinkle.metric import MetricCollection, build_metric, build_train_metrics
from twinkle.model.default_optimizer import DEFAULT_OPTIMIZER, default_lr
from twinkle.model.train_state import FULL_MODEL, TrainState
from twinkle.processor import INPUT_PROCESSORS, InputProcessor
from twinkle.template import build_template
from twinkle.utils import get_logger

logger = get_logger("twinkle.model")


def check_accumulation_steps(steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be a positive integer, got {steps!r}")
    return steps


class TrainUnitsMixin:
    """Per-unit components, batching and the accumulation rhythm, for a model holding ``_states``
    (FULL_MODEL alone, or one state per adapter) and ``model_id``."""

    _states: dict[str, TrainState]
    model_id: str | None

    def _new_state(self, name: str, gradient_accumulation_steps: int) -> TrainState:
        return TrainState(
            name=name,
            gradient_accumulation_steps=check_accumulation_steps(gradient_accumulation_steps),
            loss=build_loss("CrossEntropyLoss"),
            metrics=MetricCollection(build_train_metrics().values()),
            # The evaluation metrics start as the training defaults; the step-level ones
            # (grad_norm, lr, step_time) stay silent, as no step feeds them.
            eval_metrics=MetricCollection(build_train_metrics().values()),
        )

    @property
    def adapter_names(self) -> list[str]:
        return [name for name in self._states if name != FULL_MODEL]

    def _state(self, adapter_name: str | None) -> TrainState:
        """The named adapter's state; by default the full model's, the only adapter's, or the
        one named 'default'."""
        if adapter_name is not None:
            if adapter_name not in self._states or adapter_name == FULL_MODEL:
                known = ", ".join(self.adapter_names) or "none: add one with add_adapter_to_model"
                raise ValueError(f"unknown adapter {adapter_name!r}; adapters: {known}")
            return self._states[adapter_name]
        if FULL_MODEL in self._states:
            return self._states[FULL_MODEL]
        names = self.adapter_names
        if len(names) == 1:
            return self._states[names[0]]
        if "default" in self._states:
            return self._states["default"]
        raise ValueError(
            f"this model has several adapters ({', '.join(names)}): pass adapter_name="
        )

    @remote_function(dispatch="all", collect="first", wire=WirePolicy(named=("loss",)))
    def set_loss(self, loss: Any, *, adapter_name: str | None = None, **kwargs: Any) -> None:
        self._state(adapter_name).loss = build_loss(loss, **kwargs)

    @remote_function(
        dispatch="all",
        collect="first",
        wire=WirePolicy(named=("template",), client_drops=("model_id",)),
    )
    def set_template(
        self, template: Any, *, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        if isinstance(template, str | type):
            kwargs.setdefault("model_id", self.model_id)
        self._state(adapter_name).template = build_template(template, **kwargs)

    @remote_function(dispatch="all", collect="first", wire=WirePolicy(named=("processor",)))
    def set_processor(
        self, processor: Any, *, adapter_name: str | None = None, **kwargs: Any
    ) -> None:
        """The unit's processor: an instance, a class or a registered name
        (``'InputProcessor'``, as the Twinkle client sends it) built with ``kwargs``."""
        if isinstance(processor, str):
            processor = INPUT_PROCESSORS.get(processor)
        state = self._state(adapter_name)
        state.processor = processor(**kwargs) if isinstance(processor, type) else processor

    @remote_function(dispatch="all", collect="first")
    def add_metric(
        self,
        metric: Any,
        is_training: bool = True,
        *,
        adapter_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Add a metric to the training collection (fed by forward_backward and each optimizer
        step) or, with ``is_training=False``, to the evaluation one (fed by forward_only);
        ``calculate_metric(is_training)`` reports the same collection."""
        self._metrics(adapter_name, is_training).add(build_metric(metric, **kwargs))

    # ---- inputs: the backend's _pad_token_id ----------------------------------------------

    def _batch_of(self, inputs: Any, state: TrainState) -> dict[str, Any]:
        """InputFeatures, Trajectories (encoded by the unit's template), a sampler's result
        (its sequences' ``new_input_feature``s) or an already collated batch, as one batch of
        the unit's processor (right padding by default); not yet on the device."""
        sampled = sampled_input_features(inputs)
        inputs = inputs if sampled is None else sampled
        if isinstance(inputs, Mapping) and torch.is_tensor(inputs.get("input_ids")):
            batch = dict(inputs)
        else:
            features = (
                [inputs] if isinstance(inputs, Mapping) or hasattr(inputs, "keys") else inputs
            )
            features = list(features) if isinstance(features, Iterable) else None
            if not features:
                raise ValueError(
                    "the batch is empty: pass a non-empty list of InputFeatures or Trajectories"
                )
            if all("input_ids" not in f and "messages" in f for f in features):
                if state.template is None:
                    raise ValueError(
                        "these inputs are Trajectories (messages, no input_ids): call "
                        "set_template(...) so the model can encode them"
                    )
                features = [f for f in state.template.batch_encode(features) if f is not None]
            if state.processor is None:
                pad = self._pad_token_id() or 0
                state.processor = InputProcessor(padding_side="right", pad_token_id=pad)
            batch = state.processor(features)
        return batch

    def _metrics(self, adapter_name: str | None, is_training: bool) -> MetricCollection:
        state = self._state(adapter_name)
        return state.metrics if is_training else state.eval_metrics

    # ---- optimizer steps: the backend's _clip, _step and _zero_grad, per unit ------------

    def _optimizer_or_default(self, state: TrainState, action: str) -> Any:
        """The unit's optimizer; a unit without one first gets the default (AdamW at lr 1e-4
        for an adapter, 1e-5 for the full model; see ``default_optimizer.py``), logged."""
        if state.optimizer is None:
            full = state.name == FULL_MODEL
            lr = default_lr(state.name)
            logger.warning(
                "%s: %s has no optimizer, so it gets the default %s(lr=%g) (%s); call "
                "set_optimizer(...) before training to choose another",
                action,
                "the full model" if full else f"adapter {state.name!r}",
                DEFAULT_OPTIMIZER,
                lr,
                "full-parameter training" if full else "LoRA; full training gets 1e-5",
            )
            self.set_optimizer(DEFAULT_OPTIMIZER, lr=lr, adapter_name=None if full else state.name)
        return self._require_optimizer(state, action)

    @remote_function(dispatch="all", collect="first", wire=WirePolicy(positive=("max_norm",)))
    def clip_grad_norm(self, max_norm: float = 1.0, *, adapter_name: str | None = None) -> float:
        """Normalise (and reduce) the accumulated gradients, then clip their global norm;
        returns the norm. A unit without an optimizer gets the default one first."""
        state = self._state(adapter_name)
        self._optimizer_or_default(state, "clip_grad_norm")
        return self._clip(state, max_norm)

    @remote_function(dispatch="all", collect="first", wire=WirePolicy())
    def step(self, *, adapter_name: str | None = None) -> None:
        """One optimizer step; a unit without an optimizer gets the default one first."""
        state = self._state(adapter_name)
        self._optimizer_or_default(state, "step")
        self._step(state)

    @remote_function(dispatch="all", collect="first", wire=WirePolicy())
    def zero_grad(self, *, adapter_name: str | None = None) -> None:
        self._zero_grad(self._state(adapter_name))

    @remote_function(dispatch="all", collect="first", wire=WirePolicy())
    def lr_step(self, *, adapter_name: str | None = None) -> None:
        state = self._state(adapter_name)
        if state.lr_scheduler is not None:
            state.lr_scheduler.step()

    @remote_function(dispatch="all", collect="first", wire=WirePolicy(positive=("max_grad_norm",)))
    def clip_grad_and_step(
        self,
        max_grad_norm: float = 1.0,
        gradient_accumulation_steps: int | None = None,
        *,
        adapter_name: str | None = None,
    ) -> float | None:
        """One call per batch; the optimizer steps once ``gradient_accumulation_steps`` calls
        have accumulated since the last step (``accumulated_calls`` counts them).

        ``gradient_accumulation_steps`` given here replaces the unit's setting from this
        call on, as the documents' ``clip_grad_and_step(gradient_accumulation_steps=1)``
        does. The lr schedule advances by one per call (in a burst at each optimizer step),
        so ``num_training_steps=len(dataloader)`` spans the run whatever the accumulation,
        as the user's documents write it. Returns the gradient norm when it stepped.

        A unit stepped before ``set_optimizer`` gets the default optimizer (AdamW, lr 1e-4
        for a LoRA adapter, 1e-5 for full training, no scheduler) and a log line saying so.
        """
        state = self._state(adapter_name)
        optimizer = self._optimizer_or_default(state, "clip_grad_and_step")
        if gradient_accumulation_steps is not None:
            state.gradient_accumulation_steps = check_accumulation_steps(
                gradient_accumulation_steps
            )
        state.accumulated_calls += 1
        if state.accumulated_calls < state.gradient_accumulation_steps:
            return None
        calls, state.accumulated_calls = state.accumulated_calls, 0
        norm = self._finite_norm(state, max_grad_norm)
        lr = optimizer.param_groups[0]["lr"]
        self._step(state)
        self._zero_grad(state)
        step_time = _window_seconds(state.window_start)
        state.window_start = None
        state.metrics.accumulate(None, None, grad_norm=norm, lr=lr, step_time=step_time)
        if state.lr_scheduler is not None:
            for _ in range(calls):
                state.lr_scheduler.step()
        return norm

    @remote_function(dispatch="all", collect="first")
    def step_with(
        self,
        *,
        adapter_name: str | None = None,
        optimizer_params: Mapping[str, Any] | None = None,
        max_grad_norm: float | None = None,
        normalise: bool = True,
    ) -> float | None:
        """One optimizer step now, set up by the caller: for loops that send each step's
        hyperparameters with it and own their loss's scale (the Tinker API's optim_step).

        ``optimizer_params`` go into every param group first and stay until changed (keys the
        groups have: ``{'lr': 1e-4, 'betas': (0.9, 0.95), 'eps': 1e-8, 'weight_decay': 0}``
        for AdamW). ``normalise=False`` applies the gradient of the loss summed over the
        accumulated tokens as it is, instead of dividing it by their count (for losses that
        are sums by definition). ``max_grad_norm`` > 0 clips first and the norm is returned;
        otherwise None. The gradients are then zeroed. Unlike ``clip_grad_and_step`` it
        closes the accumulation window at once and leaves the lr scheduler alone.
        """
        state = self._state(adapter_name)
        optimizer = self._require_optimizer(state, "step_with")
        if optimizer_params:
            set_param_groups(optimizer, optimizer_params)
        if not normalise:
            state.pending_tokens = self._summed_loss_tokens()
        clips = max_grad_norm is not None and max_grad_norm > 0
        norm = self._finite_norm(state, max_grad_norm if clips else math.inf)
        norm = norm if clips else None
        lr = optimizer.param_groups[0]["lr"]
        self._step(state)
        self._zero_grad(state)
        state.accumulated_calls = 0
        step_time = _window_seconds(state.window_start)
        state.window_start = None
        state.metrics.accumulate(None, None, grad_norm=norm, lr=lr, step_time=step_time)
        return norm

    def _finite_norm(self, state: TrainState, max_norm: float) -> float:
        """The global gradient norm, clipped to ``max_norm`` (inf: measured only). A norm
        that is not finite (an overflowing loss, a NaN in the data) drops the accumulated
        gradients and refuses the step, so the weights never take a NaN or an infinity."""
        norm = self._clip(state, max_norm)
        if not math.isfinite(norm):
            self._zero_grad(state)
            state.accumulated_calls, state.window_start = 0, None
            raise ValueError(
                f"the gradient's norm is {norm}: the step was refused and the accumulated "
                "gradients dropped, so the weights are unchanged; look for loss weights, "
                "advantages or logits large enough to overflow, or NaN in the inputs"
            )
        return norm

    def _summed_loss_tokens(self) -> float:
        """The token count under which the step's division leaves the gradient of the loss
        summed over the global batch as it is: 1 on one process. A backend that trains on
        several ranks overrides it with each rank's share of that 1."""
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise NotImplementedError(
                f"{type(self).__name__} cannot yet step on summed gradients over "
                f"{dist.get_world_size()} ranks: use step_with(normalise=True) or one process"
            )
        return 1.0


def set_param_groups(optimizer: Any, params: Mapping[str, Any]) -> None:
    """Write hyperparameters into every param group: only keys the groups already have, so
    a misspelt one fails instead of being ignored. ``weight_decay`` skips a group without
    decay that holds biases and norm scales alone (``build_optimizer``'s no-decay group)."""
    if not isinstance(params, Mapping):
        raise TypeError(f"optimizer_params must be a dict, got {type(params).__name__}")
    known = {key for group in optimizer.param_groups for key in group if key != "params"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(
            f"optimizer_params {unknown} are not hyperparameters of "
            f"{type(optimizer).__name__}; its param groups have {sorted(known)}"
        )
    for group in optimizer.param_groups:
        no_decay = not group.get("weight_decay") and all(p.ndim < 2 for p in group["params"])
        for key, value in params.items():
            if key == "weight_decay" and no_decay:
                continue
            group[key] = tuple(value) if isinstance(group.get(key), tuple) else value


def _window_seconds(window_start: float | None) -> float:
    """Seconds since the window's first pass; 0 for a step with no pass since the last one
    (reading the clock once: two reads would give a tiny negative time)."""
    now = time.perf_counter()
    return now - window_start if window_start is not None else 0.0
