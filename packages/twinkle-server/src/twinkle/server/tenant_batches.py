"""Tenants' forward_backward (and forward_only) requests as items of one pass
(``FairWorker``'s ``Batchable``).

A run's ``forward_backward`` request becomes an item the model's worker may group with
other runs' at their turns; the group runs as ``MultiLoraTransformersModel
.forward_backward_many``, one forward and one backward. ``forward_only`` requests group
with each other the same way (``forward_only_many``: one forward, no gradients). Each item
is checked and decoded as the request alone would be (its run still holds its slot, its
rows within the limits), and each gets its own answer: its output, or the error that
refused it (a user's mistake a 400 naming the method, as ``ModelService.call`` answers it),
never another's. Batching is off when the config says so and in ``mode: ray`` with several
workers (each worker would run every row).
"""

from __future__ import annotations

from typing import Any

from twinkle.model.transformers.tenant_pass import SOLO_KEYWORDS, TenantRequest
from twinkle.server.scheduler import Batchable
from twinkle.server.wire import decode_value

# A method that may share a pass, and the model's method that runs such a pass.
PASSES = {"forward_backward": "forward_backward_many", "forward_only": "forward_only_many"}


def batchable(service: Any, principal: Any, live: Any, method: str, args: dict) -> Batchable | None:
    """The request as an item of a shared pass, or None when it runs alone."""
    if method not in PASSES or not service.config.model.batching.enabled or service.workers > 1:
        return None
    if not isinstance(args, dict) or any(key in args for key in SOLO_KEYWORDS):
        return None
    inputs = args.get("inputs")
    rows = len(inputs) if isinstance(inputs, list) else 1
    return Batchable(
        method, (principal, live, args), lambda items: run_many(service, method, items), rows
    )


def run_many(service: Any, method: str, items: list[tuple[Any, Any, dict]]) -> list[Any]:
    """Each item's answer (its output as JSON, or its error), from one pass of the model."""
    answers: dict[int, Any] = {}
    ready: list[tuple[int, TenantRequest]] = []
    for index, (_, live, args) in enumerate(items):
        try:
            request = service.run_for(
                live, lambda live=live, args=args: _request(service, live, args)
            )
            ready.append((index, request))
        except Exception as exc:  # noqa: BLE001 - this request's answer
            answers[index] = service.answer_error(method, exc)
    run_pass = getattr(service.model, PASSES[method])
    outcomes = run_pass([request for _, request in ready])
    for (index, _), outcome in zip(ready, outcomes, strict=True):
        if isinstance(outcome, Exception):
            answers[index] = service.answer_error(method, outcome)
        else:
            answers[index] = outcome.to_dict()
    return [answers[index] for index in range(len(items))]


def _request(service: Any, live: Any, args: dict) -> TenantRequest:
    """The model's request, decoded and checked like ``ModelService._forward_backward``
    (and ``_forward_only``)."""
    args = dict(args)
    batch = service._batch(args.pop("inputs", None))
    kwargs = {key: decode_value(value) for key, value in args.items()}
    return TenantRequest(live.adapter, batch, kwargs)
