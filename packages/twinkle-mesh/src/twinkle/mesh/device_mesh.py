"""DeviceMesh: the parallel layout of one component's workers, and the data slicing it implies.

Layout. The dense dimensions are ordered outermost to innermost as
``pp, dp, fsdp, cp, tp``, and rank numbers run row-major over them, so the
innermost dimension varies fastest. The chattiest groups therefore sit on
adjacent ranks: tensor-parallel peers are neighbours (inside one node), then
context-parallel peers, then FSDP shards; data-parallel replicas span nodes (as
HSDP wants) and pipeline stages are the outermost blocks. Example,
``from_sizes(pp_size=2, dp_size=2, tp_size=2)``::

    rank:  0  1  2  3  4  5  6  7
    pp:    0  0  0  0  1  1  1  1
    dp:    0  0  1  1  0  0  1  1
    tp:    0  1  0  1  0  1  0  1

Carved dimensions. Ulysses sequence parallel and expert parallel do not add
ranks of their own: their groups are carved from the data-parallel ranks
(``dp × fsdp``). Number a rank's position among them ``d = dp_rank × fsdp_size +
fsdp_rank``. Then Ulysses groups are blocks of ``ulysses_size`` consecutive
``d`` (peers share one data slice, so the data world is ``dp × fsdp /
ulysses``); expert-parallel groups are blocks of ``ep_size`` consecutive ``d``,
and ``ep_fsdp`` groups join the ranks with the same ``ep_rank`` inside a block
of ``ep_size × ep_fsdp_size``.

The user's documents also write these factors on top of dp, e.g.
``from_sizes(world_size=8, dp_size=2, ulysses_size=4)``. When ``world_size`` is
given and equals the dense product times the carved factor, that factor is
folded into fsdp (``dp=2, fsdp=4`` above), which is the same layout with the
Ulysses/expert peers also sharding parameters.

An explicit rank array. ``DeviceMesh(mesh=array, mesh_dim_names=(...))`` places the
ranks as the array does (any arrangement of ``0..world_size-1``, one axis per dense
dimension) instead of row-major; ``mesh`` is that array either way, and every
coordinate, group and data slice follows it.

What custom dispatch and collect functions read (``remote_function(dispatch=fn)``):
``mesh``, ``mesh_dim_names``, ``world_size``, ``<dim>_world_size`` (1 when absent) and
``data_world_size``; ``<dim>_rank`` (None when absent), ``data_rank`` and ``coords()``
for the rank the mesh is bound to. A dispatcher receives the mesh bound to the worker
it dispatches for (``at_rank(i)``), so those are worker ``i``'s wherever it runs; a
collect function sees results of every rank and reads ``coords(i)`` /
``data_rank_of(i)`` for result ``i``. Unbound, the ranks are this process's.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np

from twinkle.mesh.platform import Platform, normalize_device_type

DENSE_DIMS = ("pp", "dp", "fsdp", "cp", "tp")
CARVED_DIMS = ("ulysses", "ep", "ep_fsdp")
# DeviceMesh -> (the default process group it was built on, the torch DeviceMesh)
_TORCH_MESHES: dict = {}


def _check_size(name: str, value: object, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _dimension_size(dim: str) -> property:
    return property(lambda self: self.size(dim), doc=f"The {dim} degree; 1 when absent.")


def _dimension_rank(dim: str) -> property:
    return property(
        lambda self: self.rank_in(dim),
        doc=f"The bound rank's (else this process's) {dim} coordinate; None when absent.",
    )


def _explicit_ranks(mesh: object, shape: tuple | None, names: tuple[str, ...]) -> np.ndarray:
    """A user's rank array, checked: integers, one axis per name, each rank once."""
    ranks = np.asarray(mesh)
    if ranks.dtype.kind not in "iu":
        raise TypeError(f"mesh must be an array of integer ranks, got dtype {ranks.dtype}")
    if ranks.ndim != len(names):
        raise ValueError(
            f"mesh has {ranks.ndim} axes but mesh_dim_names names {len(names)}: {names}; "
            "give one name per axis"
        )
    if shape is not None and tuple(shape) != ranks.shape:
        raise ValueError(f"mesh_shape={tuple(shape)} differs from the mesh's shape {ranks.shape}")
    if sorted(ranks.ravel().tolist()) != list(range(ranks.size)):
        raise ValueError(
            f"mesh must hold each rank 0..{ranks.size - 1} once, got {ranks.tolist()}; a "
            "component's ranks are numbered from 0 within its group"
        )
    return ranks.astype(np.int64)


@dataclass(frozen=True)
class DeviceMesh:
    """The parallel layout of a component's workers; see the module docstring for the layout
    and for what dispatch/collect functions read from it."""

    mesh_dim_names: tuple[str, ...]
    mesh_shape: tuple[int, ...] | None = None
    device_type: str = "cuda"
    ulysses_size: int | None = None
    ep_size: int | None = None
    ep_fsdp_size: int | None = None
    etp_size: int | None = None
    vpp_size: int | None = None
    sequence_parallel: bool = False
    mesh: np.ndarray | None = field(default=None, repr=False, compare=False, hash=False)
    # The rank array as a tuple: what equality and hashing compare.
    _order: tuple[int, ...] = field(init=False, repr=False)
    _positions: np.ndarray = field(init=False, repr=False, compare=False, hash=False)
    _bound_rank: int | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Tuples keep the mesh hashable (it keys caches and travels to Ray workers).
        object.__setattr__(self, "mesh_dim_names", tuple(self.mesh_dim_names))
        ranks = None
        if self.mesh is not None:
            ranks = _explicit_ranks(self.mesh, self.mesh_shape, self.mesh_dim_names)
            object.__setattr__(self, "mesh_shape", ranks.shape)
        elif self.mesh_shape is None:
            raise ValueError("DeviceMesh needs mesh (an array of ranks) or mesh_shape")
        object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
        if not isinstance(self.sequence_parallel, bool):
            raise TypeError(
                f"sequence_parallel must be True or False, got {self.sequence_parallel!r}"
            )
        if len(self.mesh_dim_names) != len(self.mesh_shape):
            raise ValueError("mesh_dim_names and mesh_shape must have the same length")
        unknown = [d for d in self.mesh_dim_names if d not in DENSE_DIMS]
        if unknown:
            raise ValueError(f"unknown mesh dimensions {unknown}; known: {DENSE_DIMS}")
        order = [DENSE_DIMS.index(d) for d in self.mesh_dim_names]
        if order != sorted(order) or len(set(order)) != len(order):
            raise ValueError(f"mesh dimensions must be ordered as {DENSE_DIMS}, without repeats")
        for name, size in zip(self.mesh_dim_names, self.mesh_shape, strict=True):
            _check_size(f"{name}_size", size, optional=False)
        for name in ("ulysses_size", "ep_size", "ep_fsdp_size", "etp_size", "vpp_size"):
            _check_size(name, getattr(self, name))
        object.__setattr__(self, "device_type", normalize_device_type(self.device_type))
        if ranks is None:
            ranks = np.arange(math.prod(self.mesh_shape)).reshape(self.mesh_shape)
        ranks.setflags(write=False)
        object.__setattr__(self, "mesh", ranks)
        object.__setattr__(self, "_order", tuple(ranks.ravel().tolist()))
        object.__setattr__(self, "_positions", np.argsort(ranks.ravel()))
        self._check_carved_sizes()

    def _check_carved_sizes(self) -> None:
        data_ranks = self.size("dp") * self.size("fsdp")
        if data_ranks % self.size("ulysses"):
            raise ValueError(
                f"ulysses_size={self.ulysses_size} must divide the data-parallel ranks "
                f"dp × fsdp = {data_ranks}"
            )
        if self.ep_fsdp_size is not None and self.ep_size is None:
            raise ValueError("ep_fsdp_size needs ep_size: it is the FSDP degree inside EP groups")
        expert_block = self.size("ep") * self.size("ep_fsdp")
        if data_ranks % expert_block:
            raise ValueError(
                f"ep_size × ep_fsdp_size = {expert_block} must divide the data-parallel ranks "
                f"dp × fsdp = {data_ranks}"
            )
        expert_model = self.size("ep") * self.size("etp")
        dense_model = data_ranks * self.size("cp") * self.size("tp")
        if dense_model % expert_model:
            raise ValueError(
                f"ep_size × etp_size = {expert_model} must divide dp × fsdp × cp × tp = "
                f"{dense_model} (the ranks of one pipeline stage)"
            )
        if self.vpp_size is not None and self.size("pp") < 2:
            raise ValueError("vpp_size (virtual pipeline stages) needs pp_size >= 2")
        if self.sequence_parallel and self.size("tp") < 2:
            raise ValueError("sequence_parallel=True (Megatron style) needs tp_size >= 2")

    @staticmethod
    def from_sizes(
        *,
        world_size: int | None = None,
        dp_size: int = 1,
        fsdp_size: int | None = None,
        tp_size: int | None = None,
        pp_size: int | None = None,
        ulysses_size: int | None = None,
        cp_size: int | None = None,
        ep_size: int | None = None,
        etp_size: int | None = None,
        ep_fsdp_size: int | None = None,
        vpp_size: int | None = None,
        device_type: str = "cuda",
        sequence_parallel: bool = False,
    ) -> DeviceMesh:
        """Build a mesh from per-dimension sizes (None: the dimension is absent).

        ``world_size`` is inferred as the product of the dense sizes when
        omitted; when given it must match, or match once the Ulysses/expert
        factor is folded into fsdp (module docstring). Sizes must be >= 1.
        """
        _check_size("dp_size", dp_size, optional=False)
        sizes = {"pp": pp_size, "dp": dp_size, "fsdp": fsdp_size, "cp": cp_size, "tp": tp_size}
        for name, size in sizes.items():
            _check_size(f"{name}_size", size)
        for name, size in [
            ("ulysses_size", ulysses_size),
            ("ep_size", ep_size),
            ("ep_fsdp_size", ep_fsdp_size),
            ("etp_size", etp_size),
            ("vpp_size", vpp_size),
            ("world_size", world_size),
        ]:
            _check_size(name, size)
        dense = math.prod(s for s in sizes.values() if s is not None)
        carved = math.lcm(ulysses_size or 1, (ep_size or 1) * (ep_fsdp_size or 1))
        if world_size is not None and world_size != dense:
            if carved > 1 and world_size == dense * carved:
                sizes["fsdp"] = (fsdp_size or 1) * carved
            else:
                product = " × ".join(f"{n}({s})" for n, s in sizes.items() if s is not None)
                hint = ""
                if carved > 1:
                    hint = f"; nor {dense} × {carved} folding Ulysses/EP into fsdp"
                raise ValueError(
                    f"world_size={world_size} does not match the mesh sizes: "
                    f"{product} = {dense}{hint}"
                )
        present = {n: s for n, s in sizes.items() if s is not None}
        return DeviceMesh(
            mesh_dim_names=tuple(present),
            mesh_shape=tuple(present.values()),
            device_type=device_type,
            ulysses_size=ulysses_size,
            ep_size=ep_size,
            ep_fsdp_size=ep_fsdp_size,
            etp_size=etp_size,
            vpp_size=vpp_size,
            sequence_parallel=sequence_parallel,
        )

    # ---- sizes -----------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return int(self.mesh.size)

    def has_dim(self, dim: str) -> bool:
        if dim in DENSE_DIMS:
            return dim in self.mesh_dim_names
        if dim in CARVED_DIMS + ("etp", "vpp"):
            return getattr(self, f"{dim}_size") is not None
        known = DENSE_DIMS + CARVED_DIMS + ("etp", "vpp")
        raise ValueError(f"unknown mesh dimension {dim!r}; known: {known}")

    def size(self, dim: str) -> int:
        """The size of a dimension, 1 when it is absent."""
        if not self.has_dim(dim):
            return 1
        if dim in DENSE_DIMS:
            return self.mesh_shape[self.mesh_dim_names.index(dim)]
        return getattr(self, f"{dim}_size")

    @property
    def data_world_size(self) -> int:
        """How many distinct data slices a batch is split into: dp × fsdp / ulysses."""
        return self.size("dp") * self.size("fsdp") // self.size("ulysses")

    pp_world_size = _dimension_size("pp")
    dp_world_size = _dimension_size("dp")
    fsdp_world_size = _dimension_size("fsdp")
    cp_world_size = _dimension_size("cp")
    tp_world_size = _dimension_size("tp")
    ulysses_world_size = _dimension_size("ulysses")
    ep_world_size = _dimension_size("ep")
    ep_fsdp_world_size = _dimension_size("ep_fsdp")
    etp_world_size = _dimension_size("etp")

    # ---- coordinates -----------------------------------------------------------------------

    def at_rank(self, rank: int) -> DeviceMesh:
        """This mesh bound to ``rank``: its ``<dim>_rank``, ``data_rank`` and ``coords()``
        are that rank's (what a dispatch function receives for the worker it serves)."""
        rank = self._check_rank(rank)
        bound = copy.copy(self)
        object.__setattr__(bound, "_bound_rank", rank)
        return bound

    @property
    def rank(self) -> int:
        """The rank the mesh is bound to (``at_rank``), else this process's."""
        return self._check_rank(None)

    def _check_rank(self, rank: int | None) -> int:
        if rank is None:
            rank = Platform.get_rank() if self._bound_rank is None else self._bound_rank
        if isinstance(rank, bool) or not isinstance(rank, int | np.integer):
            raise TypeError(f"rank must be an int, got {rank!r}")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside this mesh of world size {self.world_size}")
        return int(rank)

    def coords(self, rank: int | None = None) -> dict[str, int]:
        """Coordinates of ``rank`` (default: this process) on every present dimension."""
        rank = self._check_rank(rank)
        index = np.unravel_index(self._positions[rank], self.mesh_shape)
        coords = {d: int(i) for d, i in zip(self.mesh_dim_names, index, strict=True)}
        d = coords.get("dp", 0) * self.size("fsdp") + coords.get("fsdp", 0)
        if self.ulysses_size is not None:
            coords["ulysses"] = d % self.ulysses_size
        if self.ep_size is not None:
            coords["ep"] = d % self.ep_size
        if self.ep_fsdp_size is not None:
            coords["ep_fsdp"] = (d // self.size("ep")) % self.ep_fsdp_size
        return coords

    def rank_in(self, dim: str, rank: int | None = None) -> int | None:
        """The coordinate of ``rank`` along ``dim``; None when the dimension is absent."""
        return self.coords(rank).get(dim) if self.has_dim(dim) else None

    def data_rank_of(self, rank: int | None = None) -> int:
        """Which data slice ``rank`` reads: equal for tp, pp, cp and Ulysses peers."""
        c = self.coords(rank)
        return (c.get("dp", 0) * self.size("fsdp") + c.get("fsdp", 0)) // self.size("ulysses")

    @property
    def data_rank(self) -> int:
        """Which data slice the bound rank (else this process) reads."""
        return self.data_rank_of()

    pp_rank = _dimension_rank("pp")
    dp_rank = _dimension_rank("dp")
    fsdp_rank = _dimension_rank("fsdp")
    cp_rank = _dimension_rank("cp")
    tp_rank = _dimension_rank("tp")
    ulysses_rank = _dimension_rank("ulysses")
    ep_rank = _dimension_rank("ep")
    ep_fsdp_rank = _dimension_rank("ep_fsdp")

    @property
    def is_first_pp(self) -> bool:
        return self.coords().get("pp", 0) == 0

    @property
    def is_last_pp(self) -> bool:
        return self.coords().get("pp", 0) == self.size("pp") - 1

    # ---- groups ----------------------------------------------------------------------------

    def _data_parallel_rows(self) -> np.ndarray:
        """All ranks as rows of dp × fsdp ranks ordered by ``d``, one row per (pp, cp, tp)."""
        full = self.mesh.reshape(
            [self.size(d) if d in self.mesh_dim_names else 1 for d in DENSE_DIMS]
        )
        pp, dp, fsdp, cp, tp = full.shape
        return full.transpose(0, 3, 4, 1, 2).reshape(pp * cp * tp, dp * fsdp)

    def group_ranks(self, dim: str) -> list[list[int]]:
        """Every group of ranks along ``dim``: members differ only in that coordinate."""
        if not self.has_dim(dim):
            raise ValueError(f"this mesh has no {dim!r} dimension (dims: {self.dim_names()})")
        if dim in DENSE_DIMS:
            axis = self.mesh_dim_names.index(dim)
            groups = np.moveaxis(self.mesh, axis, -1).reshape(-1, self.size(dim))
        elif dim == "ulysses":
            groups = self._data_parallel_rows().reshape(-1, self.size("ulysses"))
        elif dim in ("ep", "ep_fsdp"):
            blocks = self._data_parallel_rows().reshape(-1, self.size("ep_fsdp"), self.size("ep"))
            if dim == "ep_fsdp":
                blocks = blocks.transpose(0, 2, 1)
            groups = blocks.reshape(-1, self.size(dim))
        else:
            raise ValueError(f"{dim!r} has no rank groups of its own")
        return sorted(groups.tolist())

    def group_of(self, dim: str, rank: int | None = None) -> list[int]:
        """The ranks in ``rank``'s group along ``dim``."""
        rank = self._check_rank(rank)
        return next(g for g in self.group_ranks(dim) if rank in g)

    def dim_names(self) -> tuple[str, ...]:
        """Every present dimension, dense ones in layout order, then the carved ones."""
        return self.mesh_dim_names + tuple(d for d in CARVED_DIMS if self.has_dim(d))

    # ---- data ------------------------------------------------------------------------------

    def get_slice(self, total: int, rank: int | None = None) -> slice:
        """The contiguous share of ``range(total)`` read by ``rank``'s data rank.

        Shares differ in size by at most one, the remainder going to the lowest
        data ranks; with fewer items than data ranks the highest ones get an
        empty slice.
        """
        if isinstance(total, bool) or not isinstance(total, int | np.integer) or total < 0:
            raise ValueError(f"total must be a non-negative integer, got {total!r}")
        k, parts = self.data_rank_of(rank), self.data_world_size
        base, remainder = divmod(int(total), parts)
        start = k * base + min(k, remainder)
        return slice(start, start + base + (1 if k < remainder else 0))

    # ---- torch -----------------------------------------------------------------------------

    def to_torch(self):
        """A named ``torch.distributed.DeviceMesh`` over the dense dimensions.

        Made once per process group: a new ``init_process_group`` builds a new one. An
        explicit rank array keeps its arrangement.
        """
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh as TorchDeviceMesh
        from torch.distributed.device_mesh import init_device_mesh

        world_group, torch_mesh = _TORCH_MESHES.get(self, (None, None))
        if torch_mesh is None or world_group is not dist.group.WORLD:
            device, names = self.device_type, self.mesh_dim_names
            if self._order == tuple(range(self.world_size)):
                torch_mesh = init_device_mesh(device, self.mesh_shape, mesh_dim_names=names)
            else:
                ranks = torch.from_numpy(self.mesh.copy())
                torch_mesh = TorchDeviceMesh(device, ranks, mesh_dim_names=names)
            _TORCH_MESHES[self] = (dist.group.WORLD, torch_mesh)
        return torch_mesh
