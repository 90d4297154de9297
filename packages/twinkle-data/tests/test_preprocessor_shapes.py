"""The preprocessors for the common raw-row shapes, and AutoPreprocessor, which picks one
by the row's fields: each shape becomes the documented conversation, and a row of no known
shape fails naming its fields and the shapes that are known."""

import pickle

import pytest

from twinkle.dataset.fingerprint import code_fingerprint
from twinkle.preprocessor import (
    PREPROCESSORS,
    ROW_SHAPES,
    AlpacaProcessor,
    AutoPreprocessor,
    FunctionPreprocessor,
    MessagesProcessor,
    Preprocessor,
    QueryResponseProcessor,
    RowFieldError,
    SelfCognitionProcessor,
    ShareGPTProcessor,
    UnknownRowShapeError,
    row_shape,
)


def turns(trajectory):
    return [(m.role, m.content) for m in trajectory.messages]


def test_query_response_keeps_system_history_and_the_text_as_written():
    row = {
        "system": "be brief",
        "history": [["hi", "hello"], ["who?", "me"]],
        "query": "who is {{NAME}}?",
        "response": "{{NAME}} by {{AUTHOR}}",
        "tag": "en",
    }
    assert turns(QueryResponseProcessor()(row)) == [
        ("system", "be brief"),
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "who?"),
        ("assistant", "me"),
        ("user", "who is {{NAME}}?"),
        ("assistant", "{{NAME}} by {{AUTHOR}}"),
    ]


@pytest.mark.parametrize("history", [["hi", "hello"], [["only one"]], "hi"])
def test_query_response_refuses_a_history_that_is_not_pairs(history):
    with pytest.raises(RowFieldError, match="'history'") as info:
        QueryResponseProcessor()({"query": "q", "response": "r", "history": history})
    assert info.value.field == "history"


def test_sharegpt_maps_speakers_system_tools_and_function_calls():
    row = {
        "system": "you can add",
        "tools": '[{"name": "add", "description": "a+b", "parameters": {}}]',
        "conversations": [
            {"from": "human", "value": "1+2?"},
            {"from": "function_call", "value": '{"name": "add", "arguments": {"a": 1, "b": 2}}'},
            {"from": "observation", "value": "3"},
            {"from": "gpt", "value": "3"},
        ],
    }
    out = ShareGPTProcessor()(row)
    assert [m.role for m in out.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert out.messages[2].tool_calls[0].name == "add"
    assert out.messages[2].tool_calls[0].arguments == {"a": 1, "b": 2}
    assert out.messages[3].content == "3" and out.tools[0].name == "add"


def test_sharegpt_names_an_unknown_speaker_and_the_known_ones():
    row = {"conversations": [{"from": "narrator", "value": "once"}]}
    with pytest.raises(
        RowFieldError, match="turn 0 is from 'narrator'; known speakers: system, human"
    ):
        ShareGPTProcessor()(row)


def test_sharegpt_refuses_a_turn_without_from():
    with pytest.raises(RowFieldError, match="turn 1 must be a dict with 'from' and 'value'"):
        ShareGPTProcessor()({"conversations": [{"from": "human", "value": "a"}, {"text": "b"}]})


SHAPED_ROWS = {
    "messages": {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    },
    "sharegpt": {
        "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}],
        "system": "s",
    },
    "alpaca": {"instruction": "hi", "input": "there", "output": "yo", "system": "s"},
    "query_response": {"query": "hi", "response": "yo", "system": "s"},
}


@pytest.mark.parametrize("shape", list(SHAPED_ROWS))
def test_auto_converts_each_shape_as_its_own_preprocessor_does(shape):
    own = {
        "messages": MessagesProcessor(),
        "sharegpt": ShareGPTProcessor(),
        "alpaca": AlpacaProcessor(),
        "query_response": QueryResponseProcessor(),
    }[shape]
    row = SHAPED_ROWS[shape]
    assert row_shape(row) == shape
    assert AutoPreprocessor()(row) == own(row)


def test_auto_reads_sharegpt_turns_under_messages_too():
    row = {"messages": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    assert row_shape(row) == "sharegpt"
    assert turns(AutoPreprocessor()(row)) == [("user", "hi"), ("assistant", "yo")]


def test_auto_ignores_empty_columns_a_mixed_table_fills_with_none():
    row = {"messages": None, "instruction": None, "query": "q", "response": "r"}
    assert row_shape(row) == "query_response"
    assert turns(AutoPreprocessor()(row)) == [("user", "q"), ("assistant", "r")]


def test_auto_treats_self_cognition_rows_as_query_response_without_filling_them():
    row = {"query": "who is {{NAME}}?", "response": "{{NAME}} by {{AUTHOR}}", "tag": "en"}
    assert turns(AutoPreprocessor()(row))[1] == ("assistant", "{{NAME}} by {{AUTHOR}}")
    filled = SelfCognitionProcessor("Twinkle", "ModelScope")(row)
    assert turns(filled)[1] == ("assistant", "Twinkle by ModelScope"), "unchanged by the auto one"


def test_a_row_of_no_known_shape_names_its_fields_and_every_known_shape():
    with pytest.raises(UnknownRowShapeError) as info:
        AutoPreprocessor()({"prompt": "p", "answer": "a", "query": None})
    message = str(info.value)
    assert "this row's fields are answer, prompt, query (empty)" in message
    for shape in ROW_SHAPES.values():
        assert shape in message
    assert "map(...)" in message
    again = pickle.loads(pickle.dumps(info.value))  # raised inside a datasets worker
    assert str(again) == message and again.field is None


def test_auto_is_registered_and_its_repr_is_short():
    assert PREPROCESSORS.get("AutoPreprocessor") is AutoPreprocessor
    assert PREPROCESSORS.get("ShareGPTProcessor") is ShareGPTProcessor
    assert PREPROCESSORS.get("QueryResponseProcessor") is QueryResponseProcessor
    assert repr(AutoPreprocessor()) == "AutoPreprocessor()"


class _Holds(Preprocessor):
    def __init__(self, inner):
        self.inner = inner

    def __call__(self, row):
        return self.inner(row)


def test_the_cache_key_covers_the_code_of_a_held_preprocessor():
    def one(row):
        return {"messages": [{"role": "user", "content": "1"}]}

    def two(row):
        return {"messages": [{"role": "user", "content": "2"}]}

    held_one, held_two = _Holds(FunctionPreprocessor(one)), _Holds(FunctionPreprocessor(two))
    assert code_fingerprint(held_one) != code_fingerprint(held_two)
    assert code_fingerprint(AutoPreprocessor()) == code_fingerprint(AutoPreprocessor())
