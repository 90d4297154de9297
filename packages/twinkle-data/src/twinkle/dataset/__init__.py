"""Datasets built on Hugging Face ``datasets``: loading, preprocessing, encoding, mixing
and packing.

The pipeline the user's documents write::

    dataset = Dataset(DatasetMeta('bundled://self-cognition', data_slice=range(500)))
    dataset.set_template('Qwen3_5Template', model_id='bundled://tiny-qwen3', max_length=512)
    dataset.map(SelfCognitionProcessor('twinkle大模型', 'ModelScope社区'))
    dataset.encode()

``Dataset`` holds everything in Arrow files (cached by ``datasets``); ``LazyDataset``
preprocesses and encodes a row when it is read; ``IterableDataset`` streams. Packing for
padding-free training: ``PackingDataset`` and ``IterablePackingDataset``.
"""

from twinkle.dataset.dataset import Dataset
from twinkle.dataset.errors import DataRowError, StageError
from twinkle.dataset.iterable import IterableDataset
from twinkle.dataset.iterable_packing import IterablePackingDataset
from twinkle.dataset.lazy import LazyDataset
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.packing import pack_lengths, packing_efficiency
from twinkle.dataset.packing_dataset import PackingDataset

__all__ = [
    "DataRowError",
    "Dataset",
    "DatasetMeta",
    "IterableDataset",
    "IterablePackingDataset",
    "LazyDataset",
    "PackingDataset",
    "StageError",
    "pack_lengths",
    "packing_efficiency",
]
