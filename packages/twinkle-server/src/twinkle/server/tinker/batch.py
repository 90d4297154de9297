"""Tinker datums as one Twinkle batch, and the model's per-token logps back as Tinker arrays.

A Tinker datum gives input tokens ``t[0..N-1]`` and ``target_tokens y[0..N-1]``, where
``y[i]`` is predicted at position ``i`` (already shifted). Twinkle labels are not shifted
(the model shifts them), so the batch row is ``input_ids = t + [y[N-1]]`` and
``labels = [-100] + y``: label position ``i + 1`` holds ``y[i]`` and is predicted by
position ``i``, and the extra last input predicts nothing. Every other per-token input
(``weights``, ``logprobs``, ``advantages``, ...) moves with its target to position
``i + 1``. Rows are right-padded; padding has label -100 and inputs 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from twinkle.server.errors import BadRequest

IGNORE_INDEX = -100
TARGETS = "target_tokens"


def datum_arrays(datum: Any, index: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """One datum's tokens, targets and other per-token inputs, checked to have one shape."""
    tokens = np.asarray(datum.tokens, dtype=np.int64).reshape(-1)
    inputs = dict(datum.inputs)
    if TARGETS not in inputs:
        raise BadRequest(f"datum {index} has no loss_fn_inputs['target_tokens']")
    targets = np.asarray(inputs.pop(TARGETS)).reshape(-1)
    if targets.dtype.kind == "f" and not np.all(targets == np.round(targets)):
        raise BadRequest(f"datum {index}: target_tokens must be integers")
    targets = targets.astype(np.int64)
    if tokens.size == 0:
        raise BadRequest(f"datum {index} has no input tokens")
    for name, values in (("target_tokens", targets), *inputs.items()):
        size = np.asarray(values).size
        if size != tokens.size:
            raise BadRequest(
                f"datum {index}: loss_fn_inputs[{name!r}] has {size} values but the model input "
                f"has {tokens.size} tokens; give one value per input token"
            )
    extra = {k: np.asarray(v, dtype=np.float32).reshape(-1) for k, v in inputs.items()}
    return tokens, targets, extra


def build_batch(
    data: Sequence[Any], vocab_size: int, pad_token_id: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], list[int]]:
    """The collated batch, the loss's per-token keyword tensors (B, T) aligned with the
    labels, and each datum's token count (for cutting the outputs back apart)."""
    if not data:
        raise BadRequest("forward_backward needs at least one datum")
    rows = [datum_arrays(datum, i) for i, datum in enumerate(data)]
    names = set(rows[0][2])
    for i, (_, _, extra) in enumerate(rows):
        if set(extra) != names:
            raise BadRequest(
                f"datum {i} has loss_fn_inputs {sorted(extra)} but datum 0 has {sorted(names)}; "
                "every datum of a request needs the same inputs"
            )
    for i, (tokens, targets, _) in enumerate(rows):
        for name, ids in (("model_input", tokens), ("target_tokens", targets)):
            if ids.min() < 0 or ids.max() >= vocab_size:
                raise BadRequest(
                    f"datum {i}: {name} holds token ids outside the vocabulary [0, {vocab_size})"
                )
    width = max(tokens.size for tokens, _, _ in rows) + 1
    count = len(rows)
    input_ids = torch.full((count, width), pad_token_id, dtype=torch.long)
    labels = torch.full((count, width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((count, width), dtype=torch.long)
    loss_inputs = {name: torch.zeros((count, width), dtype=torch.float32) for name in names}
    lengths = []
    for b, (tokens, targets, extra) in enumerate(rows):
        n = tokens.size
        input_ids[b, :n] = torch.from_numpy(tokens)
        input_ids[b, n] = int(targets[-1])
        labels[b, 1 : n + 1] = torch.from_numpy(targets)
        mask[b, : n + 1] = 1
        for name, values in extra.items():
            loss_inputs[name][b, 1 : n + 1] = torch.from_numpy(values)
        lengths.append(n)
    position_ids = torch.arange(width).expand(count, width).clone()
    batch = {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": position_ids,
        "labels": labels,
    }
    return batch, loss_inputs, lengths


def per_datum_logprobs(logps: torch.Tensor, lengths: list[int]) -> list[np.ndarray]:
    """Row b's logps at label positions 1..N: the logprob of each target ``y[i]``."""
    logps = logps.detach().float().cpu()
    return [logps[b, 1 : n + 1].numpy().astype(np.float32) for b, n in enumerate(lengths)]
