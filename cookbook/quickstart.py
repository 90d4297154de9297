"""Quick start: the mesh and remote layer that every Twinkle training loop stands on.

Runs alone (one process) or under torchrun, unchanged:

    python cookbook/quickstart.py
    torchrun --nproc_per_node=2 cookbook/quickstart.py

It shows (1) how the documents' DeviceMeshes lay ranks out and which slice of a
batch each rank reads, (2) what the dispatch/collect rules of
``@remote_function`` do with a batch spread over workers, and (3) a
``@remote_class`` component running in local mode, its per-rank results summed
with torch.distributed when there are several processes.
"""

import twinkle
from twinkle import (
    DeviceMesh,
    Platform,
    get_device_placement,
    get_logger,
    remote_class,
    remote_function,
)
from twinkle.infra import collect, dispatch

logger = get_logger()

DOCUMENT_MESHES = {
    "dp2 x pp2 x tp2": dict(dp_size=2, pp_size=2, tp_size=2),
    "4-way Ulysses x 2-way data": dict(world_size=8, dp_size=2, ulysses_size=4),
    "2-way EP, 2-way FSDP inside EP": dict(world_size=8, dp_size=2, ep_size=2, ep_fsdp_size=2),
}


def show_layout(title: str, mesh: DeviceMesh, batch_size: int = 10) -> None:
    logger.info(f"{title}: {mesh.world_size} ranks, {mesh.data_world_size} data slices")
    for rank in range(mesh.world_size):
        share = mesh.get_slice(batch_size, rank=rank)
        logger.info(
            f"  rank {rank}: {mesh.coords(rank)} reads samples [{share.start}:{share.stop})"
        )


@remote_class(execute="all")
class TokenCounter:
    """A toy component: counts the tokens of the samples its data rank reads."""

    def __init__(self, device_mesh: DeviceMesh):
        self.device_mesh = device_mesh

    @remote_function(dispatch="slice_dp", collect="sum")
    def count(self, batch: list[list[int]]) -> int:
        return sum(len(sample) for sample in batch[self.device_mesh.get_slice(len(batch))])


def main() -> None:
    world_size = Platform.get_world_size()
    mesh = DeviceMesh.from_sizes(dp_size=world_size, device_type="cpu")
    twinkle.initialize("local", global_device_mesh=mesh, seed=0)
    logger.info(get_device_placement())

    for title, sizes in DOCUMENT_MESHES.items():
        show_layout(title, DeviceMesh.from_sizes(**sizes))

    batch = [[1] * n for n in range(1, 8)]  # 7 samples of 1..7 tokens
    tp_mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    shares = [dispatch("slice_dp", 4, i, (batch,), {}, tp_mesh)[0][0] for i in range(4)]
    logger.info(f"slice_dp over dp2 x tp2 gives workers {[len(s) for s in shares]} samples")
    counts = [sum(map(len, share)) for share in shares]
    logger.info(
        f"collect='last_pp' keeps one result per data rank: {collect('last_pp', counts, tp_mesh)}"
    )

    counter = TokenCounter(mesh, remote_group="default")
    local = counter.count(batch)
    total = local
    if world_size > 1:
        import torch
        import torch.distributed as dist

        reduced = torch.tensor(local)
        dist.all_reduce(reduced, group=mesh.to_torch()["dp"].get_group())
        total = int(reduced)
    logger.info(f"rank {Platform.get_rank()} counted {local} tokens; all ranks: {total}")
    assert total == sum(map(len, batch)), "the data ranks must cover the batch exactly once"


if __name__ == "__main__":
    main()
