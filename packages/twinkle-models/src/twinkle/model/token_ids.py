"""Token ids checked against the model's vocabulary before a forward.

An id past the embedding's rows is an ``IndexError`` from deep inside torch on a CPU, and a
device-side assert on a GPU that leaves the process unusable; checked here, it is a
``ValueError`` naming the row, the id and the vocabulary size.
"""

from __future__ import annotations

from typing import Any

import torch


def check_token_ids(input_ids: Any, embedding: Any) -> None:
    """Every id of ``input_ids`` (B, T) lies in ``[0, vocab)``, ``vocab`` being the rows of
    ``embedding``'s weight (an ``nn.Embedding``, or peft's layer around one); nothing to
    check when either is missing."""
    weight = getattr(embedding, "weight", None)
    if not torch.is_tensor(input_ids) or not torch.is_tensor(weight) or input_ids.numel() == 0:
        return
    vocab = int(weight.shape[0])
    outside = (input_ids < 0) | (input_ids >= vocab)
    if not bool(outside.any()):
        return
    position = outside.nonzero()[0].tolist()
    row = position[0] if input_ids.dim() > 1 else 0
    token = int(input_ids[tuple(position)])
    raise ValueError(
        f"input_ids row {row} holds token id {token}, outside this model's vocabulary "
        f"[0, {vocab}); encode the inputs with this model's tokenizer"
    )
