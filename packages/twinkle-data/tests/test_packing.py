"""Packing: every token lands in exactly one packed row, no label crosses a sequence
boundary, position_ids restart per sequence, the result is fixed by the seed, and the
packed rows are nearly full."""

import datasets
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from twinkle.dataset import (
    Dataset,
    DatasetMeta,
    IterableDataset,
    IterablePackingDataset,
    PackingDataset,
    pack_lengths,
    packing_efficiency,
)
from twinkle.dataset.packed_rows import pack_table
from twinkle.preprocessor import GSM8KProcessor, SelfCognitionProcessor
from twinkle.template import Qwen3_5Template

MODEL = "bundled://tiny-qwen3"
lengths_and_max = st.integers(min_value=1, max_value=64).flatmap(
    lambda max_length: st.tuples(
        st.lists(st.integers(1, max_length), max_size=200), st.just(max_length)
    )
)


@pytest.fixture(scope="module", autouse=True)
def datasets_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf")))
        yield


# ---- pack_lengths ------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(lengths_and_max, st.integers(0, 2**32 - 1))
def test_every_row_is_packed_once_and_no_bin_overflows(case, seed):
    lengths, max_length = case
    bins = pack_lengths(lengths, max_length, seed)
    assert sorted(i for members in bins for i in members) == list(range(len(lengths)))
    assert all(members == sorted(members) and members for members in bins)
    assert all(sum(lengths[i] for i in members) <= max_length for members in bins)
    # Best fit never leaves two bins that could have been one.
    loads = sorted(sum(lengths[i] for i in members) for members in bins)
    assert len(loads) < 2 or loads[0] + loads[1] > max_length


@settings(max_examples=50, deadline=None)
@given(lengths_and_max, st.integers(0, 1000))
def test_the_seed_fixes_the_result_and_only_reorders_bins(case, seed):
    lengths, max_length = case
    bins = pack_lengths(lengths, max_length, seed)
    assert pack_lengths(lengths, max_length, seed) == bins
    unshuffled = pack_lengths(lengths, max_length, None)
    assert sorted(bins) == sorted(unshuffled)


def test_different_seeds_give_different_orders():
    lengths = list(range(1, 200))
    assert pack_lengths(lengths, 256, 0) != pack_lengths(lengths, 256, 1)


def test_skewed_lengths_pack_above_99_5_percent():
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(300), 1.0, 10_000).astype(np.int64), 8, 2048)
    bins = pack_lengths(lengths, 2048)
    efficiency = packing_efficiency(lengths, bins, 2048)
    assert efficiency >= 0.995
    assert len(bins) == pytest.approx(lengths.sum() / 2048 / efficiency)


@pytest.mark.parametrize(
    "lengths,max_length,match",
    [
        (
            [3, 9, 2],
            8,
            r"1 row\(s\) are longer than max_length=8 \(row 1 has 9 tokens\).*truncation",
        ),
        ([3, 0], 8, "row 1 has length 0"),
        ([[1, 2]], 8, "flat sequence of ints"),
        ([1.5], 8, "flat sequence of ints"),
        ([1], 0, "max_length must be a positive int"),
        ([1], True, "max_length must be a positive int"),
    ],
)
def test_bad_packing_inputs(lengths, max_length, match):
    with pytest.raises(ValueError, match=match):
        pack_lengths(lengths, max_length)


def test_nothing_to_pack_gives_no_bins():
    assert pack_lengths([], 8) == []
    assert packing_efficiency([], [], 8) == 1.0


# ---- pack_table ----------------------------------------------------------------------------


def encoded_table(sequences):
    """Rows like encoded ones: ids are (row, position) codes, labels copy ids except a
    prompt of -100 at the start of each row, as a template makes them."""
    rows = []
    for r, length in enumerate(sequences):
        ids = [r * 1000 + t for t in range(length)]
        labels = [-100 if t < length // 2 else i for t, i in enumerate(ids)]
        rows.append({"input_ids": ids, "labels": labels, "length": length})
    return pa.Table.from_pylist(rows), rows


def split(values, lens):
    return np.split(np.asarray(values), np.cumsum(lens)[:-1])


@settings(max_examples=150, deadline=None)
@given(lengths_and_max, st.integers(0, 1000))
def test_packed_rows_cover_every_token_once_and_labels_never_cross(case, seed):
    lengths, max_length = case
    assume(lengths)
    table, rows = encoded_table(lengths)
    packed = pack_table(table, pack_lengths(lengths, max_length, seed)).to_pylist()
    seen = []
    for row in packed:
        assert row["length"] == len(row["input_ids"]) == len(row["labels"]) <= max_length
        assert sum(row["seq_lens"]) == row["length"]
        parts = zip(
            split(row["input_ids"], row["seq_lens"]),
            split(row["labels"], row["seq_lens"]),
            split(row["position_ids"], row["seq_lens"]),
            strict=True,
        )
        for ids, labels, positions in parts:
            source = rows[ids[0] // 1000]
            seen.append(ids[0] // 1000)
            assert ids.tolist() == source["input_ids"]
            assert positions.tolist() == list(range(len(ids)))
            # The first label is masked; the rest are the row's own labels, untouched.
            assert labels[0] == -100
            assert labels[1:].tolist() == source["labels"][1:]
            # No label predicts a token of another sequence.
            assert all(label == -100 or label // 1000 == ids[0] // 1000 for label in labels)
    assert sorted(seen) == list(range(len(lengths)))


# ---- PackingDataset --------------------------------------------------------------------------


ROWS = [
    {"query": "who are you? " + "really " * (i % 7), "response": "{{NAME}}, by {{AUTHOR}}."}
    for i in range(40)
]


@pytest.fixture(scope="module")
def template():
    return Qwen3_5Template(MODEL, max_length=96)


@pytest.fixture(scope="module")
def encoded(template):
    dataset = Dataset(DatasetMeta(data=ROWS))
    dataset.map(SelfCognitionProcessor("A", "B"))
    dataset.set_template(template)
    dataset.encode()
    return dataset


def sequences_of(packed_rows):
    """Each packed sequence's input_ids, as tuples."""
    return [
        tuple(ids.tolist()) for row in packed_rows for ids in split(row.input_ids, row.seq_lens)
    ]


def test_packing_dataset_from_a_meta_follows_the_documents(template, encoded):
    dataset = PackingDataset(DatasetMeta(data=ROWS))
    dataset.map(SelfCognitionProcessor("A", "B"))
    dataset.set_template(template)
    dataset.encode()
    assert dataset.stage == "encoded" and len(dataset) == len(ROWS)
    dataset.pack_dataset()
    assert dataset.stage == "packed" and len(dataset) < len(ROWS)
    packed = list(dataset)
    assert sorted(sequences_of(packed)) == sorted(tuple(f.input_ids.tolist()) for f in encoded)
    assert all(row.length <= template.max_length for row in packed)
    first = packed[0]
    assert first.position_ids.tolist() == [p for n in first.seq_lens for p in range(n)]
    assert repr(dataset).startswith("PackingDataset('in-memory',")


def test_packing_dataset_over_an_encoded_dataset_packs_at_once(encoded):
    dataset = PackingDataset(dataset=encoded, max_length=200)
    assert dataset.stage == "packed"
    assert all(row.length <= 200 for row in dataset)
    assert encoded.stage == "encoded" and len(encoded) == len(ROWS)  # the base is untouched
    again = PackingDataset(dataset=encoded, max_length=200)
    assert [r.input_ids.tolist() for r in again] == [r.input_ids.tolist() for r in dataset]
    other_seed = PackingDataset(dataset=encoded, max_length=200, seed=7)
    assert [r.input_ids.tolist() for r in other_seed] != [r.input_ids.tolist() for r in dataset]


def test_packing_dataset_over_an_unencoded_dataset_packs_after_encode(template):
    base = Dataset(DatasetMeta(data=ROWS[:5]))
    base.map(SelfCognitionProcessor("A", "B"))
    dataset = PackingDataset(dataset=base)
    assert dataset.stage == "trajectory"
    dataset.set_template(template)
    dataset.encode()
    dataset.pack_dataset()
    dataset.pack_dataset()  # packing a packed dataset leaves it as it is
    assert sum(len(row.seq_lens) for row in dataset) == 5


def test_packing_needs_a_max_length(encoded):
    base = Dataset(DatasetMeta(data=ROWS[:3]))
    base.map(SelfCognitionProcessor("A", "B"))
    base.set_template(Qwen3_5Template(MODEL))
    base.encode()
    with pytest.raises(ValueError, match="needs a max_length"):
        PackingDataset(dataset=base)


def test_packing_rows_longer_than_max_length_says_to_truncate(encoded):
    with pytest.raises(ValueError, match="longer than max_length=8.*truncation_strategy"):
        PackingDataset(dataset=encoded, max_length=8)


def test_packing_generation_prompts_is_refused(template):
    base = Dataset(DatasetMeta(data=[{"question": "1+1?", "answer": "#### 2"}]))
    base.map(GSM8KProcessor())
    base.set_template(template)
    base.encode(add_generation_prompt=True)
    with pytest.raises(ValueError, match="encoded without labels"):
        PackingDataset(dataset=base)


def test_packing_steps_out_of_order():
    dataset = PackingDataset(DatasetMeta(data=ROWS))
    with pytest.raises(RuntimeError, match="cannot pack dataset 'in-memory': its rows are raw"):
        dataset.pack_dataset()
    with pytest.raises(TypeError, match="either a DatasetMeta or dataset="):
        PackingDataset()
    with pytest.raises(TypeError, match="wraps a Dataset"):
        PackingDataset(dataset=dataset)


def test_packed_rows_refuse_further_steps(encoded):
    dataset = PackingDataset(dataset=encoded, max_length=200)
    with pytest.raises(RuntimeError, match="packed"):
        dataset.filter(lambda row: True)
    with pytest.raises(TypeError, match="not LazyDataset, IterableDataset or PackingDataset"):
        Dataset.mix([dataset, encoded])


# ---- IterablePackingDataset ------------------------------------------------------------------


def stream(template):
    dataset = IterableDataset(DatasetMeta(data=ROWS))
    dataset.map(SelfCognitionProcessor("A", "B"))
    dataset.set_template(template)
    dataset.encode()
    return dataset


@pytest.mark.parametrize("buffer_size", [1, 7, 1000])
def test_iterable_packing_yields_every_sequence_once_within_max_length(
    template, encoded, buffer_size
):
    dataset = IterablePackingDataset(
        dataset=stream(template), max_length=160, buffer_size=buffer_size
    )
    packed = list(dataset)
    assert sorted(sequences_of(packed)) == sorted(tuple(f.input_ids.tolist()) for f in encoded)
    assert all(row.length <= 160 and row.labels[0] == -100 for row in packed)
    assert [r.input_ids.tolist() for r in dataset] == [r.input_ids.tolist() for r in packed]


def test_iterable_packing_from_a_meta_needs_pack_dataset(template):
    dataset = IterablePackingDataset(DatasetMeta(data=ROWS), max_length=160)
    dataset.map(SelfCognitionProcessor("A", "B"))
    dataset.set_template(template)
    dataset.encode()
    assert all("seq_lens" not in row for row in dataset)  # not packed yet
    dataset.pack_dataset()
    rows = list(dataset)
    assert all("seq_lens" in row for row in rows) and len(rows) < len(ROWS)


def test_iterable_packing_checks_its_arguments(template):
    with pytest.raises(ValueError, match="buffer_size must be a positive int"):
        IterablePackingDataset(DatasetMeta(data=ROWS), buffer_size=0)
    with pytest.raises(TypeError, match="wraps an IterableDataset"):
        IterablePackingDataset(dataset=Dataset(DatasetMeta(data=ROWS)))
    with pytest.raises(ValueError, match="needs a max_length"):
        IterablePackingDataset(dataset=stream(Qwen3_5Template(MODEL)))
