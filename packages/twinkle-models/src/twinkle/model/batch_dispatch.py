"""How a model's batch methods (forward_backward, forward, forward_only) cut their arguments
over the data-parallel workers of a Ray group.

As ``'slice_dp'`` does, once a sampler's result given as ``inputs`` is its sequences'
``new_input_feature``s: a list of SampleResponses would be cut by prompt while the
per-sequence loss arguments (``advantages``, ``old_logps``) are cut by sequence, and a single
SampleResponse would reach every worker whole. Tensors with a row axis (a collated batch, its
per-row loss tensors) are cut by rows as numpy arrays are, so a batch reaches the workers in
the form it was given; ``collect='rows'`` joins the workers' outputs back in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from twinkle.data_format import sampled_input_features
from twinkle.infra import dispatch
from twinkle.mesh import DeviceMesh


def slice_dp_rows(
    length: int, index: int, args: tuple, kwargs: dict, device_mesh: DeviceMesh | None
) -> tuple[tuple, dict]:
    """Worker ``index``'s share of ``(args, kwargs)``: ``'slice_dp'`` over the rows (tensors
    included), with a sampler's result in ``inputs`` (the first argument) read as its
    sequences' features."""
    if args:
        sampled = sampled_input_features(args[0])
        if sampled is not None:
            args = (sampled, *args[1:])
    elif "inputs" in kwargs:
        sampled = sampled_input_features(kwargs["inputs"])
        if sampled is not None:
            kwargs = {**kwargs, "inputs": sampled}
    args, kwargs = dispatch("slice_dp", length, index, args, kwargs, device_mesh)

    def share(total: int) -> slice:
        return device_mesh.get_slice(total, rank=index)

    return (
        tuple(_cut_tensors(a, share) for a in args),
        {key: _cut_tensors(value, share) for key, value in kwargs.items()},
    )


def _cut_tensors(value: Any, share: Callable[[int], slice]) -> Any:
    """The share of every tensor with a row axis, inside dicts too (``'slice_dp'`` has cut
    the lists and arrays already). A copy: a pickled view would carry its whole storage."""
    if torch.is_tensor(value) and value.dim() > 0:
        return value[share(value.shape[0])].clone()
    if isinstance(value, dict):
        return {key: _cut_tensors(item, share) for key, item in value.items()}
    return value
