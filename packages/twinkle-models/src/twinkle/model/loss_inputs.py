"""The per-token loss arguments of a whole batch, aligned with its labels before the batch is
cut into micro-batches.

The documents pass ``old_logps`` as the sampler gives them: one list per sequence, either of
floats (``[lp[0][1] for lp in seq.logprobs]``) or of the sampler's own ``(token_id,
logprob)`` lists (``seq.get('logprobs', [])``). ``twinkle.loss.align_to_labels`` turns both
into a (B, T) tensor; calling it here, on the collated batch, means a mismatch names the
row of the caller's batch (not of a micro-batch) and every micro-batch gets tensor rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from twinkle.loss import align_to_labels
from twinkle.loss.fields import per_sequence_or_token

PER_TOKEN_LOSS_INPUTS = ("old_logps", "prox_logps")
"""Loss arguments that hold one value per label token of each row (``twinkle.loss.base``)."""


def align_loss_inputs(batch: Mapping[str, Any], loss_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``loss_kwargs`` with each per-token argument given as lists turned into a (B, T)
    float64 tensor on the labels' device (the loss casts it to its logps' dtype); tensors,
    and batches without labels, are left to the loss. ``advantages`` are checked (one per
    sequence or per token, finite) but left as given. A refusal here comes before the first
    micro-batch's backward, so no gradient of a refused batch is kept."""
    labels = batch.get("labels")
    if not torch.is_tensor(labels):
        return loss_kwargs
    aligned = dict(loss_kwargs)
    if aligned.get("advantages") is not None:  # its shape and values, before any forward
        per_sequence_or_token(aligned["advantages"], labels, name="advantages")
    for name in PER_TOKEN_LOSS_INPUTS:
        value = aligned.get(name)
        if value is not None and not torch.is_tensor(value):
            aligned[name] = align_to_labels(value, labels, name=name, dtype=torch.float64)
    return aligned
