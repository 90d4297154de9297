"""Which decoder layers each pipeline stage holds, checked before anything is built.

There are ``pp × vpp`` stages (``vpp`` chunks per pipeline rank, 1 without virtual stages);
stage ``s`` runs on pipeline rank ``s % pp``, as torch's looped and interleaved schedules
place them. Without an explicit split the layers are cut into contiguous runs whose
parameter counts (the embedding counted with the first stage, the final norm and head with
the last) have the smallest possible maximum, so no stage is much slower than the others.
"""

from __future__ import annotations

from collections.abc import Sequence


def stage_layers(
    layer_sizes: Sequence[int],
    pp: int,
    vpp: int | None,
    *,
    first_extra: int = 0,
    last_extra: int = 0,
    split: Sequence[int] | None = None,
) -> list[range]:
    """The layer indices of each of the ``pp × vpp`` stages, in stage order.

    ``layer_sizes`` are the layers' parameter counts; ``first_extra`` and ``last_extra``
    those of the embedding and of the norm and head; ``split`` the number of layers per
    stage, when the user fixes it. Bad sizes are a ValueError naming the numbers.
    """
    layers = len(layer_sizes)
    chunks = vpp or 1
    stages = pp * chunks
    if pp > layers:
        raise ValueError(
            f"pp_size={pp} is larger than the model's {layers} decoder layers: every "
            f"pipeline stage needs at least one layer; use pp_size <= {layers}"
        )
    if vpp is not None:
        if layers % pp:
            raise ValueError(
                f"vpp_size={vpp} needs the {layers} decoder layers to split evenly over "
                f"pp_size={pp}; pick a pp_size dividing {layers}"
            )
        per_rank = layers // pp
        if per_rank % vpp:
            raise ValueError(
                f"vpp_size={vpp} does not divide the {per_rank} layers per pipeline stage "
                f"({layers} layers / pp_size={pp}); pick a vpp_size dividing {per_rank}"
            )
    if split is not None:
        return _explicit(split, layers, stages)
    if vpp is not None:  # interleaved schedules time every chunk alike: equal chunks
        size = layers // stages
        return [range(s * size, (s + 1) * size) for s in range(stages)]
    costs = list(layer_sizes)
    return _balanced(costs, stages, first_extra, last_extra)


def _explicit(split: Sequence[int], layers: int, stages: int) -> list[range]:
    counts = list(split)
    if len(counts) != stages or any(not isinstance(n, int) or n < 1 for n in counts):
        raise ValueError(
            f"split={counts} must give {stages} positive layer counts, one per pipeline "
            f"stage (pp_size × vpp_size)"
        )
    if sum(counts) != layers:
        raise ValueError(
            f"split={counts} holds {sum(counts)} layers but the model has {layers}; the "
            f"counts must add up to {layers}"
        )
    starts = [sum(counts[:i]) for i in range(stages)]
    return [range(start, start + n) for start, n in zip(starts, counts, strict=True)]


def _balanced(costs: list[int], stages: int, first: int, last: int) -> list[range]:
    """Contiguous runs of at least one layer each minimising the largest stage's cost
    (dynamic programming over cut points; ties go to the earliest cuts)."""
    n = len(costs)
    prefix = [0]
    for cost in costs:
        prefix.append(prefix[-1] + cost)

    def cost(start: int, end: int, stage: int) -> int:
        extra = (first if stage == 0 else 0) + (last if stage == stages - 1 else 0)
        return prefix[end] - prefix[start] + extra

    # best[s][e]: the smallest maximum over stages 0..s when they hold layers [0, e).
    infinity = float("inf")
    best = [[infinity] * (n + 1) for _ in range(stages)]
    cut = [[0] * (n + 1) for _ in range(stages)]
    for end in range(1, n + 1):
        best[0][end] = cost(0, end, 0)
    for stage in range(1, stages):
        for end in range(stage + 1, n + 1):
            for start in range(stage, end):
                value = max(best[stage - 1][start], cost(start, end, stage))
                if value < best[stage][end]:
                    best[stage][end], cut[stage][end] = value, start
    bounds, end = [], n
    for stage in range(stages - 1, 0, -1):
        start = cut[stage][end]
        bounds.append(range(start, end))
        end = start
    bounds.append(range(0, end))
    return bounds[::-1]
