"""Dataset.encode with the real Qwen3_5Template on the bundled tiny tokenizer: exact
features, generation prompts, every truncation strategy, bad rows, and the cache."""

import json

import datasets
import numpy as np
import pytest

from twinkle.dataset import DataRowError, Dataset, DatasetMeta
from twinkle.preprocessor import GSM8KProcessor, SelfCognitionProcessor
from twinkle.template import Qwen3_5Template

MODEL = "bundled://tiny-qwen3"
MAX_LENGTH = 48
LONG = 5  # the row whose response is too long for MAX_LENGTH
ROWS = [
    {"query": f"who are you {i}?", "response": "I am {{NAME}}, by {{AUTHOR}}.", "tag": "en"}
    for i in range(8)
]
ROWS[LONG] = {"query": "and you?", "response": " ".join(["word"] * 60), "tag": "en"}


@pytest.fixture(scope="module", autouse=True)
def datasets_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf")))
        yield


@pytest.fixture(scope="module")
def unlimited():
    return Qwen3_5Template(MODEL)


def mapped(rows=ROWS, **meta):
    dataset = Dataset(DatasetMeta(data=rows, **meta))
    dataset.map(SelfCognitionProcessor("Twinkle", "ModelScope"))
    return dataset


def encoded(strategy, on_error="raise", **encode):
    dataset = mapped()
    dataset.set_template(
        "Qwen3_5Template", model_id=MODEL, max_length=MAX_LENGTH, truncation_strategy=strategy
    )
    dataset.encode(on_error=on_error, **encode)
    return dataset


def test_encoded_rows_equal_the_template_encoding_of_each_trajectory(unlimited):
    dataset = mapped()
    trajectories = list(dataset)
    dataset.set_template(unlimited)
    dataset.encode()
    assert dataset.stage == "encoded" and len(dataset) == len(ROWS)
    for trajectory, feature in zip(trajectories, dataset, strict=True):
        assert feature == unlimited.encode(trajectory)
        assert feature.input_ids.dtype == np.int64
    assert (dataset[0].labels != -100).sum() > 0


def test_unbatched_encode_matches_batched(unlimited):
    batched = mapped()
    batched.set_template(unlimited)
    batched.encode()
    single = mapped()
    single.set_template(unlimited)
    single.encode(batched=False)
    assert list(single) == list(batched)


def test_generation_prompts_carry_user_data_and_no_labels(unlimited):
    rows = [{"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"} for i in range(3)]
    dataset = Dataset(DatasetMeta(data=rows))
    dataset.set_template(unlimited)  # set before map, as the documents do
    dataset.map(GSM8KProcessor())
    dataset.encode(add_generation_prompt=True)
    feature = dataset[2]
    assert feature.labels is None
    assert feature.get("user_data", [{}])[0].get("answer") == "4"
    assert unlimited.decode(feature.input_ids).endswith("<|im_start|>assistant\n")


def test_training_on_a_conversation_that_ends_with_the_user_names_the_row(unlimited):
    rows = [{"question": "1 + 1?", "answer": "#### 2"}]
    dataset = Dataset(DatasetMeta(data=rows, dataset_id="prompts"))
    dataset.map(GSM8KProcessor())
    dataset.set_template(unlimited)
    with pytest.raises(DataRowError) as info:
        dataset.encode()
    assert (info.value.dataset, info.value.index, info.value.field) == ("prompts", 0, "messages")


def test_too_long_with_truncation_raise_names_the_row():
    with pytest.raises(DataRowError) as info:
        encoded("raise")
    assert (info.value.dataset, info.value.index, info.value.field) == (
        "in-memory",
        LONG,
        "messages",
    )
    assert f"more than max_length={MAX_LENGTH}" in str(info.value)


def test_too_long_with_truncation_raise_and_on_error_drop_drops_it(capsys):
    dataset = encoded("raise", on_error="drop")
    assert len(dataset) == len(ROWS) - 1 and dataset.num_dropped == 1
    assert all(feature.length <= MAX_LENGTH for feature in dataset)
    assert f"row {LONG} of 'in-memory', field 'messages'" in capsys.readouterr().err


@pytest.mark.parametrize("strategy", ["left", "right"])
def test_too_long_with_left_or_right_truncation_keeps_that_end(unlimited, strategy):
    dataset = encoded(strategy)
    assert len(dataset) == len(ROWS) and dataset.num_dropped == 0
    full = unlimited.encode(list(mapped())[LONG])
    assert full.length > MAX_LENGTH
    kept = slice(-MAX_LENGTH, None) if strategy == "left" else slice(0, MAX_LENGTH)
    assert dataset[LONG].length == MAX_LENGTH
    assert dataset[LONG].input_ids.tolist() == full.input_ids[kept].tolist()
    assert dataset[LONG].labels.tolist() == full.labels[kept].tolist()


def test_too_long_with_truncation_delete_drops_counts_and_logs(capsys):
    dataset = encoded("delete")
    assert len(dataset) == len(ROWS) - 1 and dataset.num_dropped == 1
    err = capsys.readouterr().err
    assert f"encode deleted 1 row(s) longer than max_length={MAX_LENGTH}" in err
    assert f"dataset 'in-memory' row {LONG}" in err
    assert f"dropped 1 of {len(ROWS)} rows of dataset 'in-memory'" in err


def test_map_after_encode_is_refused(unlimited):
    dataset = mapped()
    dataset.set_template(unlimited)
    dataset.encode()
    with pytest.raises(RuntimeError, match="already encoded"):
        dataset.map(SelfCognitionProcessor("A", "B"))
    with pytest.raises(RuntimeError, match="already encoded"):
        dataset.encode()


def test_filter_after_encode_sees_input_features(unlimited):
    dataset = mapped()
    dataset.set_template(unlimited)
    dataset.encode()
    dataset.filter(lambda feature: feature.length > MAX_LENGTH)
    assert len(dataset) == 1 and dataset[0].length > MAX_LENGTH


def test_an_unknown_template_name_lists_the_known_ones():
    with pytest.raises(
        ValueError, match="unknown template 'Qwen9Template'; known: .*Qwen3_5Template"
    ):
        mapped().set_template("Qwen9Template", model_id=MODEL)


def write_rows(path):
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS * 4))
    return path


def test_rerunning_an_unchanged_encode_loads_from_the_cache(tmp_path, monkeypatch):
    path = write_rows(tmp_path / "train.jsonl")
    calls = []
    original = Qwen3_5Template.batch_encode

    def counting(self, trajectories, *args, **kwargs):
        calls.append(len(trajectories))
        return original(self, trajectories, *args, **kwargs)

    monkeypatch.setattr(Qwen3_5Template, "batch_encode", counting)

    def run(max_length):
        dataset = Dataset(DatasetMeta(str(path)))
        dataset.map(SelfCognitionProcessor("A", "B"))
        dataset.set_template("Qwen3_5Template", model_id=MODEL, max_length=max_length)
        dataset.encode(on_error="drop")
        return dataset

    first = run(MAX_LENGTH)
    assert sum(calls) >= len(ROWS) * 4
    calls.clear()
    second = run(MAX_LENGTH)  # a new Dataset and a new template with the same settings
    assert calls == [], "the unchanged encode was recomputed instead of loaded"
    assert second._rows.cache_files == first._rows.cache_files
    assert list(second) == list(first)
    run(MAX_LENGTH + 1)
    assert sum(calls) >= len(ROWS) * 4, "a changed template must not be served from the cache"


def test_encode_with_two_processes_matches_one(tmp_path, unlimited):
    path = write_rows(tmp_path / "train.jsonl")
    results = []
    for num_proc in (None, 2):
        dataset = Dataset(DatasetMeta(str(path)))
        dataset.map(SelfCognitionProcessor("A", "B"))
        dataset.set_template(unlimited)
        dataset.encode(num_proc=num_proc)
        results.append(list(dataset))
    assert results[0] == results[1]
