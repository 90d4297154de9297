"""Dataset: rows loaded with Hugging Face ``datasets``, preprocessed into Trajectories,
encoded into InputFeatures, all through ``datasets.map`` and its cache."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from numbers import Integral
from typing import Any

import datasets

from twinkle.dataset.auto_map import SAMPLE_ROWS, announce_auto_preprocessing
from twinkle.dataset.errors import StageError, check_on_error
from twinkle.dataset.loading import load
from twinkle.dataset.meta import DatasetMeta
from twinkle.dataset.mixing import check_ratios, check_strategy, mix_rows
from twinkle.dataset.rows import (
    ENCODED,
    ENCODED_FEATURES,
    PACKED,
    RAW,
    TRAJECTORY,
    TRAJECTORY_FEATURES,
    public,
)
from twinkle.dataset.transforms import (
    EncodeRows,
    FilterRows,
    MapRows,
    decode,
    describe,
    rows_of,
)
from twinkle.infra import remote_class, remote_function
from twinkle.preprocessor import (
    AutoPreprocessor,
    Filter,
    Preprocessor,
    build_filter,
    build_preprocessor,
)
from twinkle.utils import get_logger

logger = get_logger("twinkle.dataset")

BATCH_SIZE = 1000
"""Rows per ``datasets.map`` batch (and per ``batch_encode`` call)."""


def check_stage(dataset: Any, action: str, allowed: Sequence[str]) -> None:
    """Refuse ``action`` on a dataset whose rows are not at one of the ``allowed`` stages."""
    if dataset.stage in allowed:
        return
    hints = {
        RAW: "its rows are raw: call set_template(...) and encode() first (encode converts "
        "rows of the common shapes itself; map(...) with a preprocessor converts others)",
        TRAJECTORY: "its rows are not encoded yet: call set_template(...) and encode() first",
        ENCODED: "its rows are already encoded: map, filter and encode run before encode()",
        PACKED: "its rows are packed: packing is the last step",
    }
    raise StageError(f"cannot {action} dataset {dataset.name!r}: {hints[dataset.stage]}")


@remote_class(execute="first")
class Dataset:
    """A dataset that goes from raw rows to Trajectories (``map``) to InputFeatures
    (``encode``), built on Hugging Face ``datasets``.

    In: a :class:`DatasetMeta` (``Dataset(meta)`` or ``Dataset(dataset_meta=meta)``).
    Out: ``dataset[i]`` (and iteration) gives a row as it stands: a dict of the source's
    columns before ``map``, a :class:`~twinkle.data_format.Trajectory` after it, an
    :class:`~twinkle.data_format.InputFeature` after ``encode``. ``dataset[i:j]`` and
    ``dataset[[i, j]]`` give lists.

    Every step is a ``datasets.map`` over Arrow files, so re-running an unchanged pipeline
    on a file-backed dataset loads each step from the ``datasets`` cache instead of
    recomputing it (``load_from_cache_file=False`` forces a recomputation). Steps run in
    place: ``map``, ``filter``, ``set_template`` and ``encode`` return None.

    A row that a preprocessor, filter or template cannot handle raises a
    :class:`~twinkle.dataset.DataRowError` naming the source dataset, the row's index in it
    and the field; with ``on_error='drop'`` such rows are left out, and every drop is
    logged with the count. ``num_dropped`` totals the rows ``map`` and ``encode`` dropped.
    """

    def __init__(self, dataset_meta: DatasetMeta) -> None:
        if not isinstance(dataset_meta, DatasetMeta):
            raise TypeError(
                f"Dataset takes a DatasetMeta, e.g. Dataset(DatasetMeta('bundled://gsm8k')), "
                f"got {type(dataset_meta).__name__}"
            )
        self._adopt(load(dataset_meta), dataset_meta.name, RAW, None)

    def _adopt(self, rows: datasets.Dataset, name: str, stage: str, template: Any) -> None:
        self._rows = rows
        self.name = name
        self.stage = stage
        self.template = template
        self.num_dropped = 0

    @classmethod
    def _from_rows(cls, rows: datasets.Dataset, name: str, stage: str, template: Any) -> Dataset:
        """A Dataset over already-stored rows (mixing, packing), without loading anything."""
        dataset = cls.__new__(cls)
        dataset._adopt(rows, name, stage, template)
        return dataset

    # ---- pipeline ------------------------------------------------------------------------

    @remote_function(dispatch="all", execute="first", collect="first")
    def map(
        self,
        preprocessor: str | type[Preprocessor] | Preprocessor | Callable[..., Any],
        init_args: Mapping[str, Any] | None = None,
        batched: bool = True,
        num_proc: int | None = None,
        load_from_cache_file: bool | None = None,
        on_error: str = "raise",
    ) -> None:
        """Turn every row into a Trajectory with ``preprocessor``: a registered name or a
        class (built with ``init_args``), an instance, or a function ``row -> Trajectory``.

        Raw rows reach it as dicts of the source's columns; after an earlier ``map`` they
        reach it as Trajectory dicts, so preprocessors chain. ``batched=True`` hands rows
        to ``preprocessor.batch`` in chunks; False calls ``preprocessor(row)`` per row.
        ``num_proc`` runs that many processes; ``load_from_cache_file`` is passed to
        ``datasets`` (None: use the cache when there is one).
        """
        check_stage(self, "map", (RAW, TRAJECTORY))
        check_on_error(on_error)
        built = build_preprocessor(preprocessor, init_args)
        self._run(
            f"map({describe(built)})",
            MapRows(built, self.stage, batched, on_error),
            num_proc,
            load_from_cache_file,
            TRAJECTORY_FEATURES,
        )
        self.stage = TRAJECTORY

    @remote_function(dispatch="all", execute="first", collect="first")
    def filter(
        self,
        filter: str | type[Filter] | Filter | Callable[[Any], bool],
        init_args: Mapping[str, Any] | None = None,
        num_proc: int | None = None,
        load_from_cache_file: bool | None = None,
        on_error: str = "raise",
    ) -> None:
        """Keep the rows for which ``filter`` (a registered name or class built with
        ``init_args``, an instance, or a function ``row -> bool``) returns True. It sees
        each row as ``dataset[i]`` gives it. How many rows it removed is logged; with
        ``on_error='drop'`` a row it fails on is removed too (and logged with the reason)."""
        check_stage(self, "filter", (RAW, TRAJECTORY, ENCODED))
        check_on_error(on_error)
        built = build_filter(filter, init_args)
        before = len(self._rows)
        self._rows = self._rows.filter(
            FilterRows(built, self.stage, on_error),
            batched=True,
            batch_size=BATCH_SIZE,
            num_proc=num_proc,
            load_from_cache_file=load_from_cache_file,
            desc=f"filter({describe(built)}) on {self.name}",
        )
        logger.info(
            "filter(%s) kept %d of %d rows of %r",
            describe(built),
            len(self._rows),
            before,
            self.name,
        )

    @remote_function(dispatch="all", execute="first", collect="first")
    def set_template(self, template: Any, **kwargs: Any) -> None:
        """Choose the Template ``encode`` uses: a registered name (``'Qwen3_5Template'``) or
        a class, built with ``kwargs`` (``model_id=..., max_length=...``), or an instance."""
        from twinkle.template import build_template

        self.template = build_template(template, **kwargs)

    @remote_function(dispatch="all", execute="first", collect="first")
    def encode(
        self,
        batched: bool = True,
        add_generation_prompt: bool = False,
        num_proc: int | None = None,
        load_from_cache_file: bool | None = None,
        on_error: str = "raise",
    ) -> None:
        """Encode every Trajectory into an InputFeature with the template.

        Raw rows no ``map`` converted are converted first by :class:`AutoPreprocessor`
        (``messages``, ShareGPT ``conversations``, Alpaca, ``query``/``response``), which
        logs the shapes it found; a row of another shape fails naming its fields.
        ``batched=True`` encodes chunks with ``template.batch_encode``; False calls
        ``template.encode`` per row. ``add_generation_prompt=True`` encodes RL prompts
        (no labels). Rows the template deletes (``truncation_strategy='delete'``) are left
        out, counted and logged.
        """
        check_stage(self, "encode", (RAW, TRAJECTORY))
        check_on_error(on_error)
        if self.template is None:
            raise StageError(
                f"dataset {self.name!r} has no template: call set_template('Qwen3_5Template', "
                "model_id=...) before encode()"
            )
        if self.stage == RAW:
            sample = self._rows.select(range(min(SAMPLE_ROWS, len(self._rows))))
            announce_auto_preprocessing(self.name, [public(row) for row in sample])
            self.map(
                AutoPreprocessor(),
                batched=batched,
                num_proc=num_proc,
                load_from_cache_file=load_from_cache_file,
                on_error=on_error,
            )
        self._run(
            f"encode({type(self.template).__name__})",
            EncodeRows(self.template, batched, add_generation_prompt, on_error),
            num_proc,
            load_from_cache_file,
            ENCODED_FEATURES,
        )
        self.stage = ENCODED

    def _run(
        self,
        what: str,
        function: MapRows | EncodeRows,
        num_proc: int | None,
        load_from_cache_file: bool | None,
        features: datasets.Features,
    ) -> None:
        """``datasets.map`` with ``function`` over batches, replacing every column; rows
        missing from the result were dropped, and are counted and logged."""
        before = len(self._rows)
        self._rows = self._rows.map(
            function,
            batched=True,
            batch_size=BATCH_SIZE,
            remove_columns=self._rows.column_names,
            features=features,
            num_proc=num_proc,
            load_from_cache_file=load_from_cache_file,
            desc=f"{what} on {self.name}",
        )
        dropped = before - len(self._rows)
        if dropped:
            self.num_dropped += dropped
            logger.warning(
                "%s dropped %d of %d rows of dataset %r (see the warnings above, logged when "
                "the step ran; a cached step is not logged again)",
                what,
                dropped,
                before,
                self.name,
            )

    @staticmethod
    def mix(
        parts: Sequence[Dataset],
        ratios: Sequence[float] | None = None,
        strategy: str = "concat",
        seed: int = 42,
    ) -> Dataset:
        """A new Dataset with the rows of ``parts``, which must be at the same stage
        (typically each mapped to Trajectories by its own preprocessor).

        ``strategy='concat'``: the parts one after another, part ``i`` scaled to
        ``round(ratios[i] * len(part))`` rows (whole copies for the integer part of a ratio,
        a seeded sample for the rest); no ratios keeps every row once.
        ``strategy='interleave'``: each next row comes from part ``i`` with probability
        ``ratios[i] / sum(ratios)`` (seeded; no ratios alternates), stopping when the first
        part runs out, so no row repeats.

        Raw rows mix when their columns agree in type (a column one part lacks reads as
        None). Rows keep their origin, so errors still name the source dataset and row. The mix
        keeps the parts' template when they share one, and has none otherwise.
        """
        parts = list(parts)
        if not parts or not all(type(part) is Dataset for part in parts):
            raise TypeError(
                "Dataset.mix takes a non-empty list of Dataset objects (not LazyDataset, "
                f"IterableDataset or PackingDataset), got {[type(p).__name__ for p in parts]}"
            )
        stages = sorted({part.stage for part in parts})
        if len(stages) > 1:
            raise ValueError(
                f"cannot mix datasets at different stages ({', '.join(stages)}): map (and "
                "encode) each one to the same stage first"
            )
        check_strategy(strategy)
        ratios = check_ratios(ratios, len(parts))
        try:
            rows = mix_rows([part._rows for part in parts], ratios, strategy, seed)
        except ValueError as err:
            if parts[0].stage != RAW:
                raise
            raise ValueError(
                f"cannot mix raw rows whose columns do not agree ({err}); map each dataset "
                "to Trajectories with its own preprocessor first, then mix"
            ) from err
        templates = {id(part.template) for part in parts}
        template = parts[0].template if len(templates) == 1 else None
        name = f"mix({', '.join(part.name for part in parts)})"
        return Dataset._from_rows(rows, name, parts[0].stage, template)

    # ---- access ------------------------------------------------------------------------

    @remote_function(dispatch="all", execute="first", collect="first")
    def __len__(self) -> int:
        return len(self._rows)

    @remote_function(dispatch="all", execute="first", collect="first")
    def __getitem__(self, index: int | slice | Sequence[int]) -> Any:
        """Row ``index`` as it stands (see the class docstring); a slice or a list of
        indices gives a list of rows."""
        if isinstance(index, Integral) and not isinstance(index, bool):
            return decode(self._rows[index], self.stage)
        if isinstance(index, slice):
            index = range(len(self._rows))[index]
        return [decode(row, self.stage) for row in rows_of(self._rows[list(index)])]

    def __iter__(self) -> Iterator[Any]:
        for batch in self._rows.iter(batch_size=BATCH_SIZE):
            for row in rows_of(batch):
                yield decode(row, self.stage)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {len(self._rows)} rows, {self.stage})"
