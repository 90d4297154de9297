"""PackingDataset: a Dataset whose encoded rows are bin-packed into rows of at most
``max_length`` tokens, for padding-free training."""

from __future__ import annotations

import datasets
from datasets.fingerprint import Hasher

from twinkle.dataset.dataset import Dataset, check_stage
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.packed_rows import pack_table
from twinkle.dataset.packing import pack_lengths, packing_efficiency
from twinkle.dataset.rows import ENCODED, PACKED
from twinkle.infra import remote_class, remote_function
from twinkle.utils import get_logger

logger = get_logger("twinkle.dataset")


def resolve_max_length(max_length: int | None, template: object, name: str) -> int:
    """``max_length``, or else the template's; one of them must be set."""
    if max_length is None:
        max_length = getattr(template, "max_length", None)
    if max_length is None:
        raise ValueError(
            f"packing dataset {name!r} needs a max_length: pass max_length=... or set a "
            "template with one (set_template(..., max_length=...))"
        )
    return max_length


@remote_class(execute="first")
class PackingDataset(Dataset):
    """A :class:`Dataset` that packs its encoded rows (``pack_dataset()``): each row it
    gives is an InputFeature holding several sequences back to back, with ``position_ids``
    restarting at 0 at each, ``seq_lens`` listing their lengths, and the first label of
    each sequence set to -100 so no label crosses a boundary (see
    ``twinkle.dataset.packed_rows``). Such rows need a padding-free (varlen) attention
    path: the model must separate the sequences by ``position_ids``/``seq_lens``.

    Two ways in, as the documents show:

    - ``PackingDataset(meta)``, then ``map``, ``set_template``, ``encode`` and
      ``pack_dataset()``;
    - ``PackingDataset(dataset=base, max_length=8192)`` over a :class:`Dataset`, packed at
      once when ``base`` is already encoded (else after its ``encode()`` and
      ``pack_dataset()`` here).

    ``max_length`` defaults to the template's. Packing is best-fit decreasing
    (``twinkle.dataset.packing.pack_lengths``), deterministic for ``seed``, which also
    shuffles the packed rows. Until packed, rows read as in a :class:`Dataset`.
    """

    def __init__(
        self,
        dataset_meta: DatasetMeta | None = None,
        *,
        dataset: Dataset | None = None,
        max_length: int | None = None,
        seed: int | None = 42,
    ) -> None:
        if (dataset_meta is None) == (dataset is None):
            raise TypeError(
                "PackingDataset takes either a DatasetMeta or dataset=<a Dataset>, not both "
                "and not neither"
            )
        if dataset is None:
            super().__init__(dataset_meta)
        elif type(dataset) is not Dataset:
            raise TypeError(
                f"PackingDataset(dataset=...) wraps a Dataset, got {type(dataset).__name__} "
                "(stream an IterableDataset through IterablePackingDataset instead)"
            )
        else:
            self._adopt(dataset._rows, dataset.name, dataset.stage, dataset.template)
            self.num_dropped = dataset.num_dropped
        self.max_length = max_length
        self.seed = seed
        if self.stage == ENCODED and dataset is not None:
            self.pack_dataset()

    @remote_function(dispatch="all", execute="first", collect="first")
    def pack_dataset(self) -> None:
        """Pack the encoded rows into rows of at most ``max_length`` tokens (a packed
        dataset stays as it is). Logs how full the packed rows are."""
        if self.stage == PACKED:
            return
        check_stage(self, "pack", (ENCODED,))
        max_length = resolve_max_length(self.max_length, self.template, self.name)
        table = self._rows.with_format("arrow")[:]
        if len(table) == 0:
            raise ValueError(f"dataset {self.name!r} has no rows to pack")
        if table.column("labels").null_count:
            raise ValueError(
                f"dataset {self.name!r} was encoded without labels (add_generation_prompt="
                "True): packing is for training rows; encode with add_generation_prompt=False"
            )
        lengths = table.column("length").to_numpy()
        bins = pack_lengths(lengths, max_length, self.seed)
        # The packed rows are a pure function of the source rows (their fingerprint) and
        # the packing settings; naming that spares datasets hashing every packed token.
        fingerprint = Hasher.hash((self._rows._fingerprint, "pack", max_length, self.seed))
        self._rows = datasets.Dataset(pack_table(table, bins), fingerprint=fingerprint)
        self.stage = PACKED
        logger.info(
            "packed %d rows of %r into %d rows of at most %d tokens (%.2f%% full)",
            len(lengths),
            self.name,
            len(bins),
            max_length,
            100 * packing_efficiency(lengths, bins, max_length),
        )
