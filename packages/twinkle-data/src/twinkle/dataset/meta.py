"""DatasetMeta: which dataset to load, and which part of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DatasetMeta:
    """Names a dataset and the rows to take from it.

    ``dataset_id`` is anything ``twinkle.hub.resolve_dataset`` accepts (``ms://org/name``,
    ``hf://org/name``, ``org/name``, ``bundled://gsm8k``, a local file or folder).
    ``subset_name`` picks a configuration (e.g. ``'main'``), ``split`` a split.
    ``data_slice`` (a ``range`` or ``slice`` of row indices) keeps those rows; a range that
    runs past the end keeps the rows that exist and logs how many it asked for.
    ``data`` is an in-memory list of row dicts used instead of loading; ``dataset_id`` then
    only names it in messages (default ``'in-memory'``).
    """

    dataset_id: str | None = None
    subset_name: str | None = None
    split: str = "train"
    data_slice: range | slice | None = None
    data: Sequence[Mapping[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.data is None and not (isinstance(self.dataset_id, str) and self.dataset_id):
            raise ValueError(
                "DatasetMeta needs a dataset_id (a hub id or a local path) or in-memory "
                f"data=[{{...}}, ...]; got dataset_id={self.dataset_id!r}"
            )
        if self.data is not None:
            if isinstance(self.data, str | bytes | Mapping) or not isinstance(self.data, Sequence):
                raise TypeError(f"data must be a list of row dicts, got {type(self.data).__name__}")
            for i, row in enumerate(self.data):
                if not isinstance(row, Mapping):
                    raise TypeError(f"data[{i}] must be a dict, got {type(row).__name__}")
        if not isinstance(self.split, str) or not self.split:
            raise ValueError(
                f"split must be a non-empty string such as 'train', got {self.split!r}"
            )
        if self.data_slice is not None and not isinstance(self.data_slice, range | slice):
            raise TypeError(
                "data_slice must be a range (range(500)) or a slice (slice(100, None)), "
                f"got {type(self.data_slice).__name__}"
            )

    @property
    def name(self) -> str:
        """How messages refer to this dataset."""
        if self.dataset_id is None:
            return "in-memory"
        return (
            self.dataset_id if self.subset_name is None else f"{self.dataset_id}:{self.subset_name}"
        )
