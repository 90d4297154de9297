"""DataLoader: global batches, each data rank's share of them, and an exact O(1) resume."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from twinkle.dataloader.length_groups import sample_lengths
from twinkle.dataloader.plan import EpochPlan
from twinkle.dataloader.stream import StreamReader
from twinkle.infra import get_global_device_mesh, get_mode, remote_class, remote_function
from twinkle.mesh import DeviceMesh, Platform
from twinkle.utils import get_logger

logger = get_logger(__name__)

DEFAULT_SEED = 42


@remote_class(execute="first")
class DataLoader:
    """Cuts a dataset into global batches and yields this data rank's share of each.

    In: ``dataset``, a map-style dataset (``__len__`` and ``__getitem__(i)``: a
    ``twinkle.dataset.Dataset``, a list of InputFeatures or dicts), a streaming
    one (re-iterable, no length: an ``IterableDataset``), or a zero-argument
    factory that builds one, so that Ray can build it on a worker.
    Out: per step a ``list`` of rows (InputFeatures for an encoded dataset),
    exactly as the dataset returns them. Turning them into tensors is the
    InputProcessor's job, called by the model (DESIGN.md §2); pass
    ``collate=`` (an ``InputProcessor()`` for instance) to get its output instead.

    ``batch_size`` is global: every step consumes ``batch_size`` samples, and
    in local mode (python, torchrun) each data rank yields its
    ``device_mesh.get_slice(len(batch))`` share (this process's rank is read
    when the loader is built); tp/pp/cp/Ulysses peers get the same share. In
    ray and http modes the loader is built once per group
    (``execute='first'``) and yields the whole global batch, which the
    components split over their data ranks when it is dispatched to them.
    ``device_mesh`` defaults to the global mesh of ``twinkle.initialize``, or,
    before it, to data parallel over the processes of this launch (one
    process: the whole batch). ``batch_size`` must be at least the data world
    size (``dp × fsdp / ulysses``) so that no rank gets an empty share.

    The final partial batch of an epoch is kept when it holds at least
    ``min_batch_size`` samples and dropped otherwise. ``min_batch_size``
    defaults to the data world size (the smallest batch that gives every data
    rank a sample); ``drop_last=True`` means ``min_batch_size=batch_size``.

    ``for batch in loader`` runs one epoch from the current position; the next
    ``for`` continues with the next epoch. ``len(loader)`` is the number of
    global batches in an epoch. With ``shuffle=True`` each epoch's order is a
    permutation drawn from ``(seed, epoch)`` (``seed`` defaults to 42), so it
    is the same on every rank and after a resume.

    ``get_state()`` returns ``consumed_train_samples`` (global samples yielded
    since the start, counted across epochs), ``epoch`` (the epoch the next
    batch comes from; a stream learns that a pass has ended only when it reads
    past its end) and ``seed``. ``resume_from_checkpoint(consumed)``
    continues exactly where a run with that count stood: the next batch is
    the one the uninterrupted run would have yielded. For a map-style dataset
    this is index arithmetic (the count fixes the epoch and the offset in
    it), whatever the count; a count past the end of an epoch lands in a
    later epoch, and a count that is not on a batch boundary of this loader
    is an error. A stream cannot seek, so it is read up to the count.

    ``group_by_length=True`` (map-style datasets) puts sequences of similar length in one
    batch, so padded batches carry little padding: each window of 64 batches of the
    epoch's order is sorted by length and its batches shuffled (``length_groups``). With
    ``shuffle=True`` the windows and the batch order are random per ``(seed, epoch)``; the
    order is rebuilt from them on resume, so a resume stays exact. Lengths come from an
    encoded Dataset's ``length`` column, read once.

    ``num_workers > 0`` fetches rows in torch DataLoader worker processes
    (map-style datasets only); batches still come in order, so the state
    stays exact.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        min_batch_size: int | None = None,
        device_mesh: DeviceMesh | None = None,
        shuffle: bool = False,
        seed: int = DEFAULT_SEED,
        num_workers: int = 0,
        drop_last: bool = False,
        collate: Callable[[list[Any]], Any] | None = None,
        group_by_length: bool = False,
    ) -> None:
        _check_int("batch_size", batch_size, minimum=1)
        _check_int("seed", seed, minimum=0)
        _check_int("num_workers", num_workers, minimum=0)
        flags = (
            ("shuffle", shuffle),
            ("drop_last", drop_last),
            ("group_by_length", group_by_length),
        )
        for name, flag in flags:
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        if collate is not None and not callable(collate):
            raise TypeError(f"collate must be a function of a list of rows, got {collate!r}")
        self.device_mesh = _resolve_mesh(device_mesh)
        self.slices_by_rank = get_mode() == "local"
        self._rank = Platform.get_rank()
        self._shares: dict[int, slice] = {}
        data_world = self.device_mesh.data_world_size
        if batch_size < data_world:
            raise ValueError(
                f"batch_size={batch_size} is smaller than the data world size {data_world} "
                f"(dp × fsdp / ulysses of the device_mesh), so some data ranks would get no "
                f"sample; batch_size is global: use batch_size >= {data_world} (a multiple of "
                f"{data_world} gives every rank the same share)"
            )
        self.min_batch_size = _resolve_min_batch_size(
            min_batch_size, batch_size, data_world, drop_last
        )
        self.dataset = _build(dataset)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_workers = num_workers
        self.collate = collate
        self.group_by_length = group_by_length
        if _is_map_style(self.dataset):
            lengths = sample_lengths(self.dataset) if group_by_length else None
            self._plan: EpochPlan | None = EpochPlan(
                len(self.dataset), batch_size, self.min_batch_size, shuffle, seed, lengths
            )
            self._reader: StreamReader | None = None
        else:
            if group_by_length:
                raise ValueError(
                    "group_by_length=True needs a map-style dataset (__len__ and __getitem__): "
                    "a stream cannot be regrouped by index; pack it (IterablePackingDataset) "
                    "or load it map-style"
                )
            if shuffle:
                raise ValueError(
                    "shuffle=True needs a map-style dataset (__len__ and __getitem__); a stream "
                    "cannot be shuffled by index: shuffle it at the source or load it map-style"
                )
            if num_workers:
                raise ValueError(
                    "num_workers > 0 needs a map-style dataset (__len__ and __getitem__): "
                    "workers reading one stream would each yield it whole; use num_workers=0"
                )
            self._plan = None
            self._reader = StreamReader(self.dataset, batch_size, self.min_batch_size)
        self._consumed = 0
        self._stop_pending = False
        self._yielded_since_iter = 0
        self._workers: Iterator[Any] | None = None
        self._worker_sizes: deque[int] = deque()

    # ---- iteration -------------------------------------------------------------------------

    @remote_function(dispatch="all", execute="first", collect="first")
    def __len__(self) -> int:
        """Global batches per epoch."""
        if self._plan is None:
            raise TypeError("a streaming dataset has no length, so its DataLoader has none")
        return self._plan.batches_per_epoch

    @remote_function(dispatch="all", execute="first", collect="first")
    def __iter__(self) -> DataLoader:
        """Start an epoch's worth of iteration from the current position."""
        self._stop_pending = False
        self._yielded_since_iter = 0
        self._workers = None
        return self

    @remote_function(dispatch="all", execute="first", collect="first")
    def __next__(self) -> Any:
        """This rank's share of the next global batch; StopIteration at the end of an epoch."""
        if self._stop_pending:
            self._stop_pending = False
            raise StopIteration
        if self._reader is not None:
            rows, ends_epoch = self._next_from_stream()
        elif self.num_workers:
            rows, ends_epoch = self._next_from_workers()
        else:
            rows, ends_epoch = self._next_from_dataset()
        self._stop_pending = ends_epoch
        self._yielded_since_iter += 1
        return rows

    def _share(self, total: int) -> slice:
        """This rank's part of a global batch of ``total`` (all of it outside local mode)."""
        if not self.slices_by_rank:
            return slice(None)
        # Only two batch sizes occur (full and final partial): look each share up once.
        if total not in self._shares:
            self._shares[total] = self.device_mesh.get_slice(total, rank=self._rank)
        return self._shares[total]

    def _collate(self, rows: list[Any]) -> Any:
        return rows if self.collate is None else self.collate(rows)

    def _next_from_dataset(self) -> tuple[Any, bool]:
        indices = self._plan.batch_indices(*self._plan.locate(self._consumed))
        rows = [self.dataset[int(i)] for i in indices[self._share(len(indices))]]
        self._consumed += len(indices)
        return self._collate(rows), self._consumed % self._plan.samples_per_epoch == 0

    def _next_from_workers(self) -> tuple[Any, bool]:
        if self._workers is None:
            self._start_workers()
        rows = next(self._workers)
        self._consumed += self._worker_sizes.popleft()
        ends_epoch = self._consumed % self._plan.samples_per_epoch == 0
        if ends_epoch:
            self._workers = None
        return rows, ends_epoch

    def _start_workers(self) -> None:
        """Worker processes fetching this rank's rows for the rest of the current epoch."""
        from torch.utils.data import DataLoader as TorchDataLoader

        epoch, offset = self._plan.locate(self._consumed)
        starts = range(offset, self._plan.samples_per_epoch, self.batch_size)
        batches = [self._plan.batch_indices(epoch, start) for start in starts]
        shares = [batch[self._share(len(batch))].tolist() for batch in batches]
        self._worker_sizes = deque(len(batch) for batch in batches)
        torch_loader = TorchDataLoader(
            self.dataset,
            batch_sampler=shares,
            num_workers=self.num_workers,
            collate_fn=self.collate or _rows_as_list,
        )
        self._workers = iter(torch_loader)

    def _next_from_stream(self) -> tuple[Any, bool]:
        # A pass that ends exactly on a batch boundary is only seen ending at the next read.
        # Right after __iter__ (e.g. after a resume at that point) that end is not an epoch
        # of its own: carry on with the next pass.
        while (step := self._reader.next_batch()) is None:
            if self._yielded_since_iter:
                raise StopIteration
        rows, ends_epoch = step
        return self._collate(rows[self._share(len(rows))]), ends_epoch

    # ---- state -----------------------------------------------------------------------------

    @remote_function(dispatch="all", execute="first", collect="first")
    def get_state(self) -> dict[str, int]:
        """``{'consumed_train_samples', 'epoch', 'seed'}``; see the class docstring."""
        if self._reader is not None:
            consumed, epoch = self._reader.consumed, self._reader.epoch
        else:
            consumed, epoch = self._consumed, self._consumed // self._plan.samples_per_epoch
        return {"consumed_train_samples": consumed, "epoch": epoch, "seed": self.seed}

    @remote_function(dispatch="all", execute="first", collect="first")
    def resume_from_checkpoint(self, consumed_train_samples: int) -> None:
        """Continue exactly after ``consumed_train_samples`` global samples (from get_state)."""
        _check_int("consumed_train_samples", consumed_train_samples, minimum=0)
        if self._reader is not None:
            self._reader.resume(consumed_train_samples)
            where = f"epoch {self._reader.epoch} of the stream"
        else:
            epoch, offset = self._plan.locate(consumed_train_samples)
            self._consumed = consumed_train_samples
            where = f"epoch {epoch}, sample {offset} of {self._plan.samples_per_epoch}"
        self._stop_pending = False
        self._yielded_since_iter = 0
        self._workers = None
        logger.info(
            f"DataLoader resumes at {where} (consumed_train_samples={consumed_train_samples})"
        )


def _rows_as_list(rows: list[Any]) -> list[Any]:
    return rows


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _resolve_mesh(device_mesh: DeviceMesh | None) -> DeviceMesh:
    if device_mesh is not None and not isinstance(device_mesh, DeviceMesh):
        raise TypeError(
            "device_mesh must be a DeviceMesh (e.g. DeviceMesh.from_sizes(dp_size=2)), "
            f"got {type(device_mesh).__name__}"
        )
    mesh = device_mesh or get_global_device_mesh()
    if mesh is None:
        return DeviceMesh.from_sizes(dp_size=Platform.get_world_size(), device_type="cpu")
    world_size = Platform.get_world_size()
    if get_mode() == "local" and mesh.world_size != world_size:
        raise ValueError(
            f"the device_mesh has world_size {mesh.world_size} but this run has {world_size} "
            f"process(es), so the data ranks would not match the processes; launch with "
            f"torchrun --nproc_per_node={mesh.world_size} or pass a mesh of {world_size}"
        )
    return mesh


def _resolve_min_batch_size(
    min_batch_size: int | None, batch_size: int, data_world: int, drop_last: bool
) -> int:
    if drop_last:
        if min_batch_size not in (None, batch_size):
            raise ValueError(
                f"drop_last=True means min_batch_size=batch_size={batch_size}, but "
                f"min_batch_size={min_batch_size} was given; pass one of the two"
            )
        return batch_size
    if min_batch_size is None:
        return data_world
    _check_int("min_batch_size", min_batch_size, minimum=1)
    if not data_world <= min_batch_size <= batch_size:
        raise ValueError(
            f"min_batch_size={min_batch_size} must lie between the data world size {data_world} "
            f"(below it a data rank would get an empty share) and batch_size={batch_size}"
        )
    return min_batch_size


def _is_map_style(dataset: object) -> bool:
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


def _is_dataset(dataset: object) -> bool:
    if isinstance(dataset, str | bytes | Mapping | type):
        return False
    return _is_map_style(dataset) or isinstance(dataset, Iterable)


def _build(dataset: Any) -> Any:
    """The dataset itself, or what a zero-argument factory returns; rejects anything else."""
    where = "the dataset argument is"
    if not _is_dataset(dataset) and callable(dataset):
        factory = getattr(dataset, "__qualname__", repr(dataset))
        dataset, where = dataset(), f"what the dataset factory {factory}() returned is"
    if isinstance(dataset, Iterator):
        raise TypeError(
            f"{where} an iterator ({type(dataset).__name__}), which can be read only once; pass "
            "something that can be iterated again every epoch (a list, a Dataset, an "
            "IterableDataset) or a factory that builds it"
        )
    if not _is_dataset(dataset):
        raise TypeError(
            f"{where} of type {type(dataset).__name__}, not a dataset: pass a map-style dataset "
            "(__len__ and __getitem__), a re-iterable stream, or a zero-argument factory that "
            "returns one"
        )
    return dataset
