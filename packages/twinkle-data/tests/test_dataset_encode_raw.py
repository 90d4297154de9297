"""encode() on rows no map() converted: AutoPreprocessor converts the common shapes (logging
once what it found), for Dataset, LazyDataset and IterableDataset alike; a row of another
shape fails naming the row, its fields and the known shapes; mapping first is unchanged."""

import json

import datasets
import pytest

from twinkle.dataset import DataRowError, Dataset, DatasetMeta, IterableDataset, LazyDataset
from twinkle.preprocessor import (
    AlpacaProcessor,
    MessagesProcessor,
    QueryResponseProcessor,
    SelfCognitionProcessor,
    ShareGPTProcessor,
)
from twinkle.template import Qwen3_5Template

MODEL = "bundled://tiny-qwen3"
SHAPES = {
    "query_response": (
        QueryResponseProcessor(),
        [{"query": f"q{i}", "response": f"r{i}", "system": "s"} for i in range(4)],
    ),
    "alpaca": (
        AlpacaProcessor(),
        [{"instruction": f"i{i}", "input": "x" * (i % 2), "output": f"o{i}"} for i in range(4)],
    ),
    "messages": (
        MessagesProcessor(),
        [
            {
                "messages": [
                    {"role": "user", "content": f"u{i}"},
                    {"role": "assistant", "content": "a"},
                ]
            }
            for i in range(4)
        ],
    ),
    "sharegpt": (
        ShareGPTProcessor(),
        [
            {
                "system": "s",
                "conversations": [
                    {"from": "human", "value": f"h{i}"},
                    {"from": "gpt", "value": "g"},
                ],
            }
            for i in range(4)
        ],
    ),
}


@pytest.fixture(scope="module", autouse=True)
def datasets_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf")))
        yield


@pytest.fixture(scope="module")
def template():
    return Qwen3_5Template(MODEL)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("shape", list(SHAPES))
def test_raw_rows_of_each_shape_encode_as_their_own_preprocessor_would(
    shape, template, tmp_path, capsys
):
    processor, rows = SHAPES[shape]
    path = write_jsonl(tmp_path / f"{shape}.jsonl", rows)
    dataset = Dataset(DatasetMeta(str(path)))
    dataset.set_template(template)
    dataset.encode()
    assert dataset.stage == "encoded" and len(dataset) == len(rows)
    assert [f.input_ids.tolist() for f in dataset] == [
        template.encode(processor(row)).input_ids.tolist() for row in rows
    ]
    err = capsys.readouterr().err
    assert err.count("AutoPreprocessor converts its raw rows") == 1
    assert f"of the first 4 rows: 4 {shape}." in err


def test_the_bundled_self_cognition_set_encodes_without_map_and_warns_of_placeholders(
    template, capsys
):
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition"))
    dataset.set_template(template)
    dataset.encode()
    assert len(dataset) == 100
    assert "{{NAME}}" in dataset[1].messages[1].content, "trained as written"
    err = capsys.readouterr().err
    assert "of the first 100 rows: 100 query_response." in err
    assert "holds the self-cognition placeholders {{NAME}}/{{AUTHOR}}" in err
    assert "map('SelfCognitionProcessor'" in err


def test_mapping_first_is_unchanged_and_logs_nothing_automatic(template, capsys):
    dataset = Dataset(dataset_meta=DatasetMeta("bundled://self-cognition"))
    dataset.map("SelfCognitionProcessor", init_args={"model_name": "T", "model_author": "M"})
    dataset.set_template(template)
    dataset.encode()
    assert (
        dataset[1].messages[1].content
        == SelfCognitionProcessor("T", "M")(Dataset(DatasetMeta("bundled://self-cognition"))[1])
        .messages[1]
        .content
    )
    err = capsys.readouterr().err
    assert "AutoPreprocessor" not in err and "placeholders" not in err


UNKNOWN = [{"query": "q", "response": "r"}, {"prompt": "p", "completion": "c"}]


def test_a_row_of_unknown_shape_names_the_row_its_fields_and_the_known_shapes(template):
    dataset = Dataset(DatasetMeta(data=UNKNOWN, dataset_id="odd"))
    dataset.set_template(template)
    with pytest.raises(DataRowError) as info:
        dataset.encode()
    message = str(info.value)
    assert "dataset 'odd', row 1" in message
    assert "fields are completion, prompt, query (empty), response (empty)" in message
    assert "instruction + output (Alpaca" in message and "conversations (ShareGPT" in message


def test_rows_of_unknown_shape_can_be_dropped(template, capsys):
    dataset = Dataset(DatasetMeta(data=UNKNOWN))
    dataset.set_template(template)
    dataset.encode(on_error="drop")
    assert len(dataset) == 1 and dataset.num_dropped == 1
    assert "dropped 1 row(s) (on_error='drop'): row 1" in capsys.readouterr().err


@pytest.mark.parametrize("cls", [LazyDataset, IterableDataset])
def test_lazy_and_streamed_datasets_encode_raw_rows_the_same_way(cls, template, capsys):
    rows = SHAPES["alpaca"][1] + SHAPES["sharegpt"][1]
    eager = Dataset(DatasetMeta(data=rows))
    eager.set_template(template)
    eager.encode()
    other = cls(DatasetMeta(data=rows))
    other.set_template(template)
    other.encode()
    assert [f.input_ids.tolist() for f in other] == [f.input_ids.tolist() for f in eager]
    err = capsys.readouterr().err
    assert "of the first 8 rows: 4 alpaca, 4 sharegpt." in err


def test_a_lazy_row_of_unknown_shape_fails_when_read(template):
    lazy = LazyDataset(DatasetMeta(data=UNKNOWN, dataset_id="odd"))
    lazy.set_template(template)
    lazy.encode()
    assert lazy[0].length > 0
    with pytest.raises(DataRowError, match="dataset 'odd', row 1.*the shapes it knows are"):
        lazy[1]
