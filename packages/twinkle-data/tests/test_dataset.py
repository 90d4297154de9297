"""Dataset: loading every supported source, preprocessing with map/filter, the errors a bad
row raises, the datasets cache, and mixing."""

import importlib
import json
import logging
import pickle
import sys

import datasets
import numpy as np
import pytest

from twinkle.data_format import Trajectory
from twinkle.dataset import DataRowError, Dataset, DatasetMeta, StageError
from twinkle.preprocessor import Filter, Preprocessor, SelfCognitionProcessor

SELF_COGNITION = [
    {
        "query": f"Question {i}: who is {{{{NAME}}}}?",
        "response": "{{NAME}} by {{AUTHOR}}",
        "tag": "en",
    }
    for i in range(12)
]


@pytest.fixture(scope="module", autouse=True)
def datasets_cache(tmp_path_factory):
    """Keep the datasets cache of these tests out of the user's home folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf")))
        yield


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path


def queries(dataset):
    return [row["query"] for row in dataset]


# ---- loading -------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_a_local_file_of_each_format_loads(tmp_path, suffix):
    rows = SELF_COGNITION[:5]
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        write_jsonl(path, rows)
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".csv":
        datasets.Dataset.from_list(rows).to_csv(str(path), index=False)
    else:
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    dataset = Dataset(DatasetMeta(str(path)))
    assert len(dataset) == 5
    assert dataset[3] == rows[3]


def test_a_text_file_gives_one_row_per_line(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("first line\nsecond line\n")
    assert list(Dataset(DatasetMeta(str(path)))) == [
        {"text": "first line"},
        {"text": "second line"},
    ]


def test_a_folder_of_split_files_picks_the_split(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", SELF_COGNITION[:4])
    write_jsonl(tmp_path / "test.jsonl", SELF_COGNITION[4:6])
    assert len(Dataset(DatasetMeta(str(tmp_path)))) == 4
    assert queries(Dataset(DatasetMeta(str(tmp_path), split="test"))) == queries(
        SELF_COGNITION[4:6]
    )


def test_a_subset_folder_is_picked_by_subset_name(tmp_path):
    write_jsonl(tmp_path / "main" / "train.jsonl", SELF_COGNITION[:3])
    write_jsonl(tmp_path / "socratic" / "train.jsonl", SELF_COGNITION[3:5])
    dataset = Dataset(DatasetMeta(str(tmp_path), subset_name="socratic", split="train"))
    assert queries(dataset) == queries(SELF_COGNITION[3:5])
    assert dataset.name == f"{tmp_path}:socratic"


def test_an_unknown_split_names_the_dataset(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", SELF_COGNITION[:2])
    with pytest.raises(ValueError, match=rf"dataset '{tmp_path}'.*validation"):
        Dataset(DatasetMeta(str(tmp_path), split="validation"))


def test_a_missing_file_says_which_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="no file or folder at") as info:
        Dataset(DatasetMeta(str(missing)))
    assert str(missing) in str(info.value)


def test_a_file_of_unknown_format_is_refused(tmp_path):
    path = tmp_path / "data.xml"
    path.write_text("<rows/>")
    with pytest.raises(ValueError, match="cannot tell the format of data.xml"):
        Dataset(DatasetMeta(str(path)))


def test_in_memory_rows_take_the_union_of_their_keys():
    dataset = Dataset(DatasetMeta(data=[{"a": 1}, {"a": 2, "b": "x"}]))
    assert list(dataset) == [{"a": 1, "b": None}, {"a": 2, "b": "x"}]
    assert dataset.name == "in-memory"


def test_in_memory_rows_of_mixed_types_in_a_column_are_refused():
    with pytest.raises(ValueError, match="do not share one type per column"):
        Dataset(DatasetMeta(data=[{"a": 1}, {"a": [1, 2]}]))


@pytest.mark.parametrize(
    "kwargs,error",
    [
        ({}, "needs a dataset_id"),
        ({"data": "rows"}, "data must be a list of row dicts"),
        ({"data": [1]}, r"data\[0\] must be a dict"),
        ({"dataset_id": "x", "split": ""}, "split must be a non-empty string"),
        ({"dataset_id": "x", "data_slice": [1, 2]}, "data_slice must be a range"),
    ],
)
def test_bad_dataset_meta(kwargs, error):
    with pytest.raises((TypeError, ValueError), match=error):
        DatasetMeta(**kwargs)


def test_dataset_takes_a_dataset_meta():
    with pytest.raises(TypeError, match="Dataset takes a DatasetMeta"):
        Dataset("bundled://gsm8k")


def test_data_slice_range_and_slice_select_rows():
    by_range = Dataset(DatasetMeta(data=SELF_COGNITION, data_slice=range(2, 8, 3)))
    assert queries(by_range) == queries([SELF_COGNITION[2], SELF_COGNITION[5]])
    by_slice = Dataset(DatasetMeta(data=SELF_COGNITION, data_slice=slice(-2, None)))
    assert queries(by_slice) == queries(SELF_COGNITION[-2:])


def test_a_range_past_the_end_keeps_what_exists_and_says_so(capsys):
    # The documents ask range(1000) of a self-cognition set that has about a hundred rows.
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION, data_slice=range(1000)))
    assert len(dataset) == len(SELF_COGNITION)
    assert "data_slice range(0, 1000) keeps the 12 that exist" in capsys.readouterr().err


def test_a_negative_range_is_refused():
    with pytest.raises(ValueError, match="negative bound"):
        Dataset(DatasetMeta(data=SELF_COGNITION, data_slice=range(-3, 0)))


def test_indexing_slices_lists_and_iteration():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION))
    assert dataset[-1] == SELF_COGNITION[-1]
    assert dataset[np.int64(2)] == SELF_COGNITION[2]
    assert dataset[1:4] == SELF_COGNITION[1:4]
    assert dataset[[5, 0]] == [SELF_COGNITION[5], SELF_COGNITION[0]]
    assert list(dataset) == SELF_COGNITION
    assert repr(dataset) == "Dataset('in-memory', 12 rows, raw)"


# ---- map and filter ------------------------------------------------------------------------


def test_map_with_an_instance_gives_trajectories():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION))
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    row = dataset[0]
    assert isinstance(row, Trajectory)
    assert [m.content for m in row.messages] == [
        "Question 0: who is twinkle大模型?",
        "twinkle大模型 by ModelScope社区",
    ]
    assert dataset.stage == "trajectory"


def test_map_by_name_with_init_args_as_the_documents_do():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION))
    dataset.map(
        "SelfCognitionProcessor", init_args={"model_name": "twinkle模型", "model_author": "社区"}
    )
    assert dataset[1].messages[1].content == "twinkle模型 by 社区"


def test_map_with_a_function_and_chained_maps():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION[:3]))
    dataset.map(lambda row: {"messages": [{"role": "user", "content": row["query"]}]})
    # A second map sees each row as a Trajectory dict.
    dataset.map(
        lambda t: {
            "messages": [{"role": "system", "content": "be brief"}, *t["messages"]],
            "user_data": [{"n": len(t["messages"])}],
        }
    )
    assert [m.role for m in dataset[2].messages] == ["system", "user"]
    assert dataset[2].user_data == [{"n": 1}]


def test_unbatched_map_matches_batched_map():
    batched = Dataset(DatasetMeta(data=SELF_COGNITION))
    batched.map(SelfCognitionProcessor("A", "B"))
    single = Dataset(DatasetMeta(data=SELF_COGNITION))
    single.map(SelfCognitionProcessor("A", "B"), batched=False)
    assert list(single) == list(batched)


def test_a_row_without_query_names_dataset_source_row_and_field(tmp_path):
    rows = [dict(row) for row in SELF_COGNITION]
    del rows[7]["query"]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    # data_slice starts at 5, so row 7 of the file is row 2 of the dataset: the error
    # names the file's row.
    dataset = Dataset(DatasetMeta(str(path), data_slice=range(5, 10)))
    with pytest.raises(DataRowError) as info:
        dataset.map(SelfCognitionProcessor("A", "B"))
    error = info.value
    assert (error.dataset, error.index, error.field) == (str(path), 7, "query")
    assert f"dataset '{path}', row 7, field 'query': missing from the row" in str(error)
    assert "on_error='drop'" in str(error)


def test_a_row_without_messages_names_the_field():
    dataset = Dataset(DatasetMeta(data=[{"messages": [{"role": "user"}]}, {"prompt": "hi"}]))
    with pytest.raises(DataRowError, match="row 1, field 'messages': missing from the row"):
        dataset.map("MessagesProcessor")


def test_an_unknown_preprocessor_name_lists_the_known_ones():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION))
    with pytest.raises(ValueError, match="unknown preprocessor 'Alpaca'; known: AlpacaProcessor"):
        dataset.map("Alpaca")


def test_a_preprocessor_returning_something_else_is_named():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION[:2]))
    with pytest.raises(DataRowError, match="row 0, field unknown: TypeError: a preprocessor must"):
        dataset.map(lambda row: row["query"])


def test_a_key_error_in_a_user_function_names_the_key():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION[:2]))
    with pytest.raises(DataRowError, match="row 0, field 'question'"):
        dataset.map(lambda row: {"messages": [{"role": "user", "content": row["question"]}]})


def test_an_invalid_trajectory_names_the_offending_field():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION[:2]))
    with pytest.raises(DataRowError, match=r"row 0, field 'messages.0.role'"):
        dataset.map(lambda row: {"messages": [{"role": "robot", "content": "x"}]})


def test_an_empty_conversation_is_refused():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION[:2]))
    with pytest.raises(DataRowError, match="the conversation has no messages"):
        dataset.map(lambda row: {"messages": []})


class BatchFails(Preprocessor):
    """Its batch method always fails; its per-row call fails on one row only."""

    def batch(self, rows):
        raise RuntimeError("batch failed")

    def __call__(self, row):
        if row["query"].startswith("Question 4:"):
            raise ValueError("cannot handle question 4")
        return {"messages": [{"role": "user", "content": row["query"]}]}


def test_a_failing_batch_is_redone_row_by_row_to_name_the_row():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION))
    with pytest.raises(DataRowError, match="row 4, field unknown: ValueError: cannot handle"):
        dataset.map(BatchFails())


def test_on_error_drop_counts_and_logs_the_dropped_rows(capsys):
    rows = [dict(row) for row in SELF_COGNITION]
    del rows[3]["query"]
    del rows[9]["response"]
    dataset = Dataset(DatasetMeta(data=rows))
    dataset.map(SelfCognitionProcessor("A", "B"), on_error="drop")
    assert len(dataset) == 10 and dataset.num_dropped == 2
    err = capsys.readouterr().err
    assert "dropped 2 row(s) (on_error='drop'): row 3 of 'in-memory', field 'query'" in err
    assert "row 9 of 'in-memory', field 'response'" in err
    assert "dropped 2 of 12 rows of dataset 'in-memory'" in err


def test_on_error_must_be_raise_or_drop():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION))
    with pytest.raises(ValueError, match="on_error must be one of 'raise', 'drop'"):
        dataset.map(SelfCognitionProcessor("A", "B"), on_error="skip")


def test_data_row_errors_survive_pickling_out_of_a_worker():
    error = pickle.loads(pickle.dumps(DataRowError("d", 3, "query", "missing")))
    assert (error.dataset, error.index, error.field, error.reason) == ("d", 3, "query", "missing")


def test_filter_with_a_function_keeps_rows_and_logs_the_count(capsys):
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION))
    dataset.filter(lambda row: row["query"].startswith(("Question 1:", "Question 3:")))
    assert queries(dataset) == queries([SELF_COGNITION[1], SELF_COGNITION[3]])
    assert "kept 2 of 12 rows of 'in-memory'" in capsys.readouterr().err


class HasAnswer(Filter):
    def __call__(self, trajectory) -> bool:
        return "3" in trajectory.messages[0].content


def test_filter_after_map_sees_trajectories():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION))
    dataset.map(SelfCognitionProcessor("A", "B"))
    dataset.filter(HasAnswer())
    assert [t.messages[0].content for t in dataset] == ["Question 3: who is A?"]


def test_a_filter_must_return_a_bool():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION))
    with pytest.raises(DataRowError, match="a filter must return True or False, got 'yes'"):
        dataset.filter(lambda row: "yes")


def test_filter_errors_can_be_dropped():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION))
    dataset.filter(lambda row: 1 / int(row["query"][9] != "5") > 0, on_error="drop")
    assert len(dataset) == 11


def test_steps_out_of_order_say_what_to_do():
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION))
    with pytest.raises(RuntimeError, match=r"has no template: call set_template"):
        dataset.encode()
    assert dataset.stage == "raw", "nothing was converted before the template check"
    dataset.map(SelfCognitionProcessor("A", "B"))
    with pytest.raises(RuntimeError, match=r"has no template: call set_template"):
        dataset.encode()


def test_a_step_out_of_order_is_also_a_value_error():
    """So a service running the dataset for a client answers it as the client's mistake."""
    dataset = Dataset(DatasetMeta(data=SELF_COGNITION))
    with pytest.raises(StageError) as caught:
        dataset.encode()
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, RuntimeError)


# ---- storage round trip ------------------------------------------------------------------


def test_messages_tools_and_user_data_round_trip_exactly():
    trajectory = Trajectory(
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "add"}]},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "use the tool",
                "tool_calls": [{"id": "c1", "name": "add", "arguments": {"a": 1, "b": [2.5]}}],
            },
            {"role": "tool", "content": "3.5", "tool_call_id": "c1"},
            {"role": "assistant", "content": "3.5"},
        ],
        tools=[{"name": "add", "description": "adds", "parameters": {"type": "object"}}],
        user_data=[{"target": 24, "nums": [3, 8], "ratio": 0.5, "nested": {"ok": True}}],
    )
    dataset = Dataset(DatasetMeta(data=[{"x": 0}]))
    dataset.map(lambda row: trajectory)
    assert dataset[0] == trajectory
    assert dataset[0].messages[1].tool_calls[0].arguments == {"a": 1, "b": [2.5]}


# ---- cache -------------------------------------------------------------------------------


CALLS = {"count": 0}


class CountingProcessor(SelfCognitionProcessor):
    """Counts its calls in a module global, which is not part of its fingerprint."""

    def __call__(self, row):
        CALLS["count"] += 1
        return super().__call__(row)


def test_rerunning_an_unchanged_pipeline_loads_from_the_cache(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", SELF_COGNITION)

    def run(**kwargs):
        dataset = Dataset(DatasetMeta(str(path), data_slice=range(10)))
        dataset.map(CountingProcessor("A", "B"), **kwargs)
        return dataset

    CALLS["count"] = 0
    first = run()
    assert CALLS["count"] == 10
    second = run()
    assert CALLS["count"] == 10, "the unchanged map was recomputed instead of loaded"
    assert second._rows.cache_files == first._rows.cache_files
    assert list(second) == list(first)
    run(load_from_cache_file=False)
    assert CALLS["count"] == 20


def test_a_changed_preprocessor_is_not_served_from_the_cache(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", SELF_COGNITION)
    first = Dataset(DatasetMeta(str(path)))
    first.map(SelfCognitionProcessor("A", "B"))
    second = Dataset(DatasetMeta(str(path)))
    second.map(SelfCognitionProcessor("A", "C"))
    assert second._rows.cache_files != first._rows.cache_files
    assert second[0].messages[1].content == "A by C"


SHOUT = """
from twinkle.preprocessor import Preprocessor


class Shout(Preprocessor):
    def __call__(self, row):
        return {"messages": [{"role": "user", "content": row["query"].upper()}]}
"""


def test_an_edited_preprocessor_module_is_not_served_the_old_rows(tmp_path, monkeypatch):
    # Pickling records an imported class by name alone, so datasets would reuse the cache.
    path = write_jsonl(tmp_path / "data" / "train.jsonl", SELF_COGNITION)
    module = tmp_path / "edited_preprocessors.py"
    module.write_text(SHOUT)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "edited_preprocessors", raising=False)
    shout = importlib.import_module("edited_preprocessors")
    before = Dataset(DatasetMeta(str(path)))
    before.map(shout.Shout())
    assert before[0].messages[0].content == "QUESTION 0: WHO IS {{NAME}}?"
    module.write_text(SHOUT.replace(".upper()", ".lower() + '!'"))
    shout = importlib.reload(shout)
    after = Dataset(DatasetMeta(str(path)))
    after.map(shout.Shout())
    assert after[0].messages[0].content == "question 0: who is {{name}}?!"
    monkeypatch.delitem(sys.modules, "edited_preprocessors")


def test_num_proc_gives_the_same_rows_and_names_bad_rows(tmp_path):
    rows = [dict(row) for row in SELF_COGNITION * 3]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    serial = Dataset(DatasetMeta(str(path)))
    serial.map(SelfCognitionProcessor("A", "B"))
    parallel = Dataset(DatasetMeta(str(path)))
    parallel.map(SelfCognitionProcessor("A", "B"), num_proc=2)
    assert list(parallel) == list(serial)
    del rows[30]["response"]
    bad = Dataset(DatasetMeta(str(write_jsonl(tmp_path / "bad" / "train.jsonl", rows))))
    with pytest.raises(DataRowError, match="row 30, field 'response'"):
        bad.map(SelfCognitionProcessor("A", "B"), num_proc=2)


# ---- mixing ------------------------------------------------------------------------------


def countdown_like(count, offset=0):
    dataset = Dataset(
        DatasetMeta(data=[{"target": offset + i} for i in range(count)], dataset_id="countdown")
    )
    dataset.map(
        lambda row: {
            "messages": [{"role": "user", "content": str(row["target"])}],
            "user_data": [{"target": row["target"], "nums": [1, 2]}],
        }
    )
    return dataset


def gsm8k_like(count):
    dataset = Dataset(DatasetMeta(data=[{"q": f"q{i}"} for i in range(count)], dataset_id="gsm8k"))
    dataset.map(
        lambda row: {
            "messages": [{"role": "user", "content": row["q"]}],
            "user_data": [{"answer": row["q"][1:]}],
        }
    )
    return dataset


def test_concat_mixes_datasets_whose_user_data_keys_differ():
    mixed = Dataset.mix([countdown_like(3), gsm8k_like(2)])
    assert [row.user_data for row in mixed] == [
        [{"target": 0, "nums": [1, 2]}],
        [{"target": 1, "nums": [1, 2]}],
        [{"target": 2, "nums": [1, 2]}],
        [{"answer": "0"}],
        [{"answer": "1"}],
    ]
    assert mixed.name == "mix(countdown, gsm8k)" and mixed.stage == "trajectory"


def test_concat_ratios_scale_each_part_with_a_seed():
    def contents(mixed):
        return [row.messages[0].content for row in mixed]

    mixed = Dataset.mix([countdown_like(10), gsm8k_like(10)], ratios=[2.5, 0.3], seed=1)
    rows = contents(mixed)
    assert len(rows) == 25 + 3
    assert sorted(rows[:25]) == sorted([str(i) for i in range(10)] * 2 + rows[20:25])
    assert len(set(rows[20:25])) == 5 and all(r.startswith("q") for r in rows[25:])
    again = Dataset.mix([countdown_like(10), gsm8k_like(10)], ratios=[2.5, 0.3], seed=1)
    assert contents(again) == rows
    other = Dataset.mix([countdown_like(10), gsm8k_like(10)], ratios=[2.5, 0.3], seed=2)
    assert contents(other) != rows


def test_interleave_draws_by_ratio_with_a_seed_and_stops_at_the_first_exhausted():
    def sources(mixed):
        return ["gsm8k" if row.user_data[0].get("answer") else "countdown" for row in mixed]

    mixed = Dataset.mix(
        [countdown_like(2000), gsm8k_like(2000)], ratios=[3, 1], strategy="interleave", seed=0
    )
    picks = sources(mixed)
    assert picks.count("countdown") == 2000  # the first part ran out first
    assert 0.70 < picks.count("countdown") / len(picks) < 0.80
    again = Dataset.mix(
        [countdown_like(2000), gsm8k_like(2000)], ratios=[3, 1], strategy="interleave", seed=0
    )
    assert sources(again) == picks


def test_interleave_without_ratios_alternates():
    mixed = Dataset.mix([countdown_like(2), gsm8k_like(3)], strategy="interleave")
    assert [row.messages[0].content for row in mixed] == ["0", "q0", "1", "q1"]


def test_errors_after_mixing_name_the_source_dataset_and_row():
    first = Dataset(DatasetMeta(data=SELF_COGNITION[:3], dataset_id="first"))
    rows = [dict(row) for row in SELF_COGNITION[:3]]
    del rows[1]["query"]
    second = Dataset(DatasetMeta(data=rows, dataset_id="second"))
    mixed = Dataset.mix([first, second])
    with pytest.raises(DataRowError, match="dataset 'second', row 1, field 'query'"):
        mixed.map(SelfCognitionProcessor("A", "B"))


def test_raw_rows_mix_when_their_columns_agree_in_type():
    mixed = Dataset.mix(
        [Dataset(DatasetMeta(data=[{"a": 1}])), Dataset(DatasetMeta(data=[{"b": "x"}]))]
    )
    assert list(mixed) == [{"a": 1, "b": None}, {"a": None, "b": "x"}]
    with pytest.raises(ValueError, match="map each dataset to Trajectories"):
        Dataset.mix(
            [Dataset(DatasetMeta(data=[{"a": 1}])), Dataset(DatasetMeta(data=[{"a": "x"}]))]
        )


def test_mixing_checks_its_arguments():
    raw = Dataset(DatasetMeta(data=[{"a": 1}]))
    with pytest.raises(ValueError, match="different stages"):
        Dataset.mix([raw, countdown_like(1)])
    with pytest.raises(ValueError, match="unknown mixing strategy 'zip'"):
        Dataset.mix([raw, raw], strategy="zip")
    with pytest.raises(ValueError, match="got 1 ratios for 2 datasets"):
        Dataset.mix([raw, raw], ratios=[1])
    with pytest.raises(ValueError, match="must not be negative"):
        Dataset.mix([raw, raw], ratios=[1, -1])
    with pytest.raises(TypeError, match="non-empty list of Dataset objects"):
        Dataset.mix([])


# ---- remote ------------------------------------------------------------------------------


def test_dataset_is_a_remote_component_built_on_the_first_worker():
    assert Dataset.__twinkle_remote_class__.execute == "first"
    for name in ("map", "filter", "set_template", "encode", "__len__", "__getitem__"):
        assert getattr(Dataset, name).__twinkle_remote__.dispatch == "all"
    dataset = Dataset(DatasetMeta(data=[{"a": 1}]), remote_group="data")
    assert dataset.remote_group == "data" and len(dataset) == 1


def test_logging_goes_through_the_twinkle_logger():
    assert not logging.getLogger("twinkle").propagate
