"""How a model's batch methods (forward_backward, forward, forward_only) cut their arguments
over the data-parallel workers of a Ray group.

As ``'slice_dp'`` does, once a sampler's result given as ``inputs`` is its sequences'
``new_input_feature``s: a list of SampleResponses would be cut by prompt while the
per-sequence loss arguments (``advantages``, ``old_logps``) are cut by sequence, and a single
SampleResponse would reach every worker whole.
"""

from __future__ import annotations

from twinkle.data_format import sampled_input_features
from twinkle.infra import dispatch
from twinkle.mesh import DeviceMesh


def slice_dp_rows(
    length: int, index: int, args: tuple, kwargs: dict, device_mesh: DeviceMesh | None
) -> tuple[tuple, dict]:
    """Worker ``index``'s share of ``(args, kwargs)``: ``'slice_dp'`` over the rows, with a
    sampler's result in ``inputs`` (the first argument) read as its sequences' features."""
    if args:
        sampled = sampled_input_features(args[0])
        if sampled is not None:
            args = (sampled, *args[1:])
    elif "inputs" in kwargs:
        sampled = sampled_input_features(kwargs["inputs"])
        if sampled is not None:
            kwargs = {**kwargs, "inputs": sampled}
    return dispatch("slice_dp", length, index, args, kwargs, device_mesh)
