"""LazyDataset (work on access) and IterableDataset (streaming): the same rows as the
eager Dataset pipeline, and the same errors for bad rows."""

import json

import datasets
import pytest

from twinkle.dataset import DataRowError, Dataset, DatasetMeta, IterableDataset, LazyDataset
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.template import Qwen3_5Template

MODEL = "bundled://tiny-qwen3"
ROWS = [
    {"query": f"who are you {i}? " + "really " * (i % 5), "response": "{{NAME}} by {{AUTHOR}}"}
    for i in range(30)
]


@pytest.fixture(scope="module", autouse=True)
def datasets_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf")))
        yield


@pytest.fixture(scope="module")
def template():
    return Qwen3_5Template(MODEL, max_length=64)


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def pipeline(cls, meta, template, **encode):
    dataset = cls(meta)
    dataset.map(SelfCognitionProcessor("A", "B"))
    dataset.set_template(template)
    dataset.encode(**encode)
    return dataset


@pytest.fixture(scope="module")
def eager(jsonl, template):
    return list(pipeline(Dataset, DatasetMeta(str(jsonl)), template))


# ---- LazyDataset ---------------------------------------------------------------------------


def test_lazy_rows_equal_eager_rows(jsonl, template, eager):
    lazy = pipeline(LazyDataset, DatasetMeta(str(jsonl)), template)
    assert len(lazy) == len(ROWS)
    assert lazy[7] == eager[7]
    assert list(lazy) == eager


def test_lazy_rows_at_each_stage():
    lazy = LazyDataset(DatasetMeta(data=ROWS[:2]))
    assert lazy[1] == ROWS[1] and lazy.stage == "raw"
    lazy.map(SelfCognitionProcessor("A", "B"))
    lazy.map(lambda t: {"messages": t["messages"][:1]})  # maps chain on Trajectory dicts
    assert [m.content for m in lazy[0].messages] == [ROWS[0]["query"]]
    assert repr(lazy) == "LazyDataset('in-memory', 2 rows, trajectory on access)"


def test_a_lazy_bad_row_fails_when_read_naming_its_source_row():
    rows = [dict(row) for row in ROWS]
    del rows[12]["response"]
    lazy = LazyDataset(DatasetMeta(data=rows, data_slice=range(10, 20)))
    lazy.map(SelfCognitionProcessor("A", "B"))
    assert lazy[0].messages[1].content == "A by B"
    with pytest.raises(DataRowError, match="dataset 'in-memory', row 12, field 'response'"):
        lazy[2]


def test_a_lazy_row_the_template_deletes_is_an_error():
    lazy = LazyDataset(DatasetMeta(data=ROWS[:1]))
    lazy.map(SelfCognitionProcessor("A", "B"))
    lazy.set_template("Qwen3_5Template", model_id=MODEL, max_length=4, truncation_strategy="delete")
    lazy.encode()
    with pytest.raises(DataRowError, match="'delete' cannot drop a row of a LazyDataset"):
        lazy[0]


def test_a_lazy_template_error_names_the_row():
    lazy = LazyDataset(DatasetMeta(data=ROWS[:1], dataset_id="cut"))
    lazy.map(SelfCognitionProcessor("A", "B"))
    lazy.set_template("Qwen3_5Template", model_id=MODEL, max_length=4)
    lazy.encode()
    with pytest.raises(DataRowError, match="dataset 'cut', row 0, field 'messages'"):
        lazy[0]


def test_lazy_steps_out_of_order_and_bad_indices():
    lazy = LazyDataset(DatasetMeta(data=ROWS[:1]))
    with pytest.raises(RuntimeError, match="has no template"):
        lazy.encode()
    assert lazy.stage == "raw", "nothing was recorded before the template check"
    lazy.map(SelfCognitionProcessor("A", "B"))
    with pytest.raises(RuntimeError, match="has no template"):
        lazy.encode()
    with pytest.raises(TypeError, match="indexed by an int"):
        lazy["0"]


# ---- IterableDataset -------------------------------------------------------------------------


def test_streamed_rows_equal_eager_rows_on_every_pass(jsonl, template, eager):
    stream = pipeline(IterableDataset, DatasetMeta(str(jsonl)), template)
    assert list(stream) == eager
    assert list(stream) == eager  # a second pass starts again from the beginning
    assert not hasattr(stream, "__len__")


def test_streamed_raw_rows_hide_the_origin_columns(jsonl):
    stream = IterableDataset(DatasetMeta(str(jsonl), data_slice=range(3, 6)))
    assert list(stream) == ROWS[3:6]


def test_streaming_in_memory_rows_with_a_slice():
    stream = IterableDataset(DatasetMeta(data=ROWS, data_slice=slice(28, None)))
    assert list(stream) == ROWS[28:]


def test_a_streaming_slice_must_go_forward_by_one():
    with pytest.raises(ValueError, match="step 1 and non-negative bounds"):
        IterableDataset(DatasetMeta(data=ROWS, data_slice=range(0, 10, 2)))


def test_a_streamed_bad_row_names_its_source_row(jsonl):
    rows = [dict(row) for row in ROWS]
    del rows[17]["query"]
    stream = IterableDataset(DatasetMeta(data=rows))
    stream.map(SelfCognitionProcessor("A", "B"))
    with pytest.raises(DataRowError, match="dataset 'in-memory', row 17, field 'query'"):
        list(stream)


def test_streamed_bad_rows_can_be_dropped_and_are_logged(capsys):
    rows = [dict(row) for row in ROWS]
    del rows[17]["query"]
    stream = IterableDataset(DatasetMeta(data=rows))
    stream.map(SelfCognitionProcessor("A", "B"), on_error="drop")
    assert len(list(stream)) == len(ROWS) - 1
    assert "dropped 1 row(s) (on_error='drop'): row 17 of 'in-memory'" in capsys.readouterr().err


def test_streamed_filter_then_encode():
    stream = IterableDataset(DatasetMeta(data=ROWS))
    stream.filter(lambda row: row["query"].endswith("? "))  # the rows without "really"
    stream.map(SelfCognitionProcessor("A", "B"))
    stream.set_template("Qwen3_5Template", model_id=MODEL, max_length=64)
    stream.encode()
    features = list(stream)
    assert len(features) == 6
    assert all(f.labels is not None for f in features)
    assert repr(stream) == "IterableDataset('in-memory', streaming, encoded)"


def test_streamed_steps_out_of_order():
    stream = IterableDataset(DatasetMeta(data=ROWS))
    with pytest.raises(RuntimeError, match="has no template"):
        stream.encode()
    assert stream.stage == "raw"
    with pytest.raises(TypeError, match="IterableDataset takes a DatasetMeta"):
        IterableDataset(ROWS)


def test_lazy_dataset_gives_plain_dicts_to_a_preprocessor_mapped_twice():
    from twinkle.dataset import DatasetMeta, LazyDataset
    from twinkle.preprocessor import Preprocessor

    class Echo(Preprocessor):
        seen: list[str] = []

        def __call__(self, row):
            self.seen.append(type(row).__name__)
            if "messages" in row:
                return row
            return {"messages": [{"role": "user", "content": row["query"]}]}

    echo = Echo()
    lazy = LazyDataset(DatasetMeta(data=[{"query": "hi"}]))
    lazy.map(echo)
    lazy.map(echo)
    lazy[0]
    assert echo.seen == ["dict", "dict"]
