"""Preprocessors: each built-in turns its rows into the documented Trajectory, names the
missing field of a bad row, and is found by name in the registry."""

import pickle

import pytest
from datasets.fingerprint import Hasher

from twinkle.data_format import Trajectory
from twinkle.preprocessor import (
    FILTERS,
    PREPROCESSORS,
    AlpacaProcessor,
    CountdownProcessor,
    Filter,
    FunctionFilter,
    FunctionPreprocessor,
    MessagesProcessor,
    Preprocessor,
    RowFieldError,
    SelfCognitionProcessor,
    build_filter,
    build_preprocessor,
)
from twinkle.preprocessor.llm import GSM8KProcessor, gsm8k_final_answer


def roles(trajectory: Trajectory) -> list[str]:
    return [message.role for message in trajectory.messages]


def test_self_cognition_fills_name_and_author_in_query_and_response():
    processor = SelfCognitionProcessor("Twinkle模型", "ModelScope社区")
    out = processor(
        {"query": "{{NAME}}是谁做的?", "response": "我是{{NAME}}, 由{{AUTHOR}}开发。", "tag": "zh"}
    )
    assert roles(out) == ["user", "assistant"]
    assert out.messages[0].content == "Twinkle模型是谁做的?"
    assert out.messages[1].content == "我是Twinkle模型, 由ModelScope社区开发。"
    assert out.user_data == []


def test_self_cognition_takes_keywords_as_the_documents_do():
    processor = SelfCognitionProcessor(model_name="A", model_author="B")
    assert processor({"query": "{{AUTHOR}}", "response": "{{NAME}}"}).messages[1].content == "A"


@pytest.mark.parametrize("name,author", [("", "B"), ("A", None)])
def test_self_cognition_rejects_empty_names(name, author):
    with pytest.raises(ValueError, match="must be a non-empty string"):
        SelfCognitionProcessor(name, author)


def test_a_row_without_query_names_the_field_and_what_the_row_has():
    with pytest.raises(RowFieldError, match="'query': missing from the row") as info:
        SelfCognitionProcessor("A", "B")({"response": "hi", "tag": "en"})
    assert info.value.field == "query"
    assert "response, tag" in str(info.value)


def test_a_field_of_the_wrong_type_is_named():
    with pytest.raises(RowFieldError, match="'response': must be a str, got int"):
        SelfCognitionProcessor("A", "B")({"query": "q", "response": 3})


def test_alpaca_joins_instruction_and_input():
    processor = AlpacaProcessor()
    with_input = processor({"instruction": "Translate", "input": "hello", "output": "你好"})
    assert [m.content for m in with_input.messages] == ["Translate\n\nhello", "你好"]
    without = processor({"instruction": "Say hi", "input": "", "output": "hi"})
    assert [m.content for m in without.messages] == ["Say hi", "hi"]


def test_alpaca_uses_a_system_column_when_there_is_one():
    out = AlpacaProcessor()({"instruction": "i", "output": "o", "system": "be brief"})
    assert roles(out) == ["system", "user", "assistant"]
    assert out.messages[0].content == "be brief"


def test_alpaca_row_without_output_names_it():
    with pytest.raises(RowFieldError, match="'output'"):
        AlpacaProcessor()({"instruction": "i"})


def test_gsm8k_keeps_the_final_answer_in_user_data():
    row = {"question": "Tom has 3 apples...", "answer": "3 * 400 = <<3*400=1200>>1200\n#### 1,200"}
    out = GSM8KProcessor()(row)
    assert roles(out) == ["user"]
    assert out.messages[0].content.startswith("Tom has 3 apples...")
    assert "#### <answer>" in out.messages[0].content
    assert out.user_data == [{"answer": "1200"}]
    assert out.get("user_data", [{}])[0].get("answer") == "1200"


def test_gsm8k_system_prompt_is_optional():
    out = GSM8KProcessor(system="You are a math tutor.")({"question": "q", "answer": "#### 4"})
    assert roles(out) == ["system", "user"]


@pytest.mark.parametrize("answer", ["no marker here", "steps ####   "])
def test_gsm8k_answer_without_a_final_number_is_an_error(answer):
    with pytest.raises(RowFieldError, match="'answer'"):
        gsm8k_final_answer(answer)


def test_countdown_user_data_reads_back_as_the_documents_read_it():
    out = CountdownProcessor()({"nums": [3, 8, 1.0], "target": 24.0})
    trajectory = out.to_dict()  # the documents' reward gets plain dicts
    user_data = trajectory.get("user_data", [{}])
    data = user_data[0] if isinstance(user_data, list) and user_data else {}
    assert data.get("target", 0) == 24 and isinstance(data["target"], int)
    assert data.get("nums", []) == [3, 8, 1]
    prompt = out.messages[-1].content
    assert "[3, 8, 1]" in prompt and "24" in prompt and "<answer>" in prompt


@pytest.mark.parametrize(
    "row,field",
    [
        ({"target": 3}, "nums"),
        ({"nums": [], "target": 3}, "nums"),
        ({"nums": [1, 2.5], "target": 3}, "nums"),
        ({"nums": [1, 2], "target": "3"}, "target"),
        ({"nums": [1, 2], "target": True}, "target"),
    ],
)
def test_countdown_bad_rows_name_the_field(row, field):
    with pytest.raises(RowFieldError) as info:
        CountdownProcessor()(row)
    assert info.value.field == field


def test_messages_processor_passes_a_conversation_through():
    messages = [
        {"role": "system", "content": "s", "tool_calls": None},
        {"role": "user", "content": "u", "reasoning_content": None},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "add", "arguments": '{"a": 1}'}],
        },
        {"role": "tool", "content": "1", "tool_call_id": "c1"},
        {"role": "assistant", "content": "done", "reasoning_content": "easy"},
    ]
    tools = '[{"type": "function", "function": {"name": "add", "parameters": {}}}]'
    out = MessagesProcessor()({"messages": messages, "tools": tools, "extra": 1})
    assert roles(out) == ["system", "user", "assistant", "tool", "assistant"]
    assert out.messages[2].tool_calls[0].arguments == '{"a": 1}'
    assert out.messages[4].reasoning_content == "easy"
    assert out.tools[0].name == "add"


def test_messages_processor_reads_json_strings_and_copies_user_data_fields():
    row = {"messages": '[{"role": "user", "content": "2+2?"}]', "answer": "4"}
    out = MessagesProcessor(user_data_fields=["answer"])(row)
    assert out.messages[0].content == "2+2?"
    assert out.user_data == [{"answer": "4"}]


def test_messages_processor_keeps_an_existing_user_data_column():
    row = {"messages": [{"role": "user", "content": "q"}], "user_data": [{"target": 1}]}
    assert MessagesProcessor()(row).user_data == [{"target": 1}]


@pytest.mark.parametrize(
    "row,match",
    [
        ({"conversation": []}, "'messages': missing from the row"),
        ({"messages": "not json"}, "'messages': is a string but not valid JSON"),
        ({"messages": '{"role": "user"}'}, "'messages': must decode to a list"),
    ],
)
def test_messages_processor_bad_rows(row, match):
    with pytest.raises(RowFieldError, match=match):
        MessagesProcessor()(row)


def test_messages_processor_user_data_field_missing():
    with pytest.raises(RowFieldError, match="'answer'"):
        MessagesProcessor(user_data_fields=["answer"])({"messages": [{"role": "user"}]})


def test_every_builtin_is_registered_under_its_class_name():
    assert set(PREPROCESSORS.names()) >= {
        "AlpacaProcessor",
        "CountdownProcessor",
        "GSM8KProcessor",
        "MessagesProcessor",
        "SelfCognitionProcessor",
    }
    assert PREPROCESSORS.get("CountdownProcessor") is CountdownProcessor


def test_build_preprocessor_from_a_name_with_init_args():
    built = build_preprocessor(
        "SelfCognitionProcessor", {"model_name": "twinkle模型", "model_author": "ModelScope社区"}
    )
    assert isinstance(built, SelfCognitionProcessor) and built.model_author == "ModelScope社区"


def test_build_preprocessor_from_a_class_an_instance_and_a_function():
    assert isinstance(build_preprocessor(AlpacaProcessor), AlpacaProcessor)
    instance = GSM8KProcessor()
    assert build_preprocessor(instance) is instance
    wrapped = build_preprocessor(lambda row: {"messages": [{"role": "user", "content": "x"}]})
    assert isinstance(wrapped, FunctionPreprocessor)
    assert wrapped({})["messages"][0]["content"] == "x"


def test_an_unknown_preprocessor_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown preprocessor 'SelfCognition'") as info:
        build_preprocessor("SelfCognition")
    assert "SelfCognitionProcessor" in str(info.value) and "GSM8KProcessor" in str(info.value)


def test_init_args_with_an_instance_is_an_error():
    with pytest.raises(TypeError, match="init_args is for a preprocessor given by name"):
        build_preprocessor(AlpacaProcessor(), {"x": 1})


def test_a_class_that_is_not_a_preprocessor_is_refused():
    with pytest.raises(TypeError, match="must subclass Preprocessor"):
        build_preprocessor(dict)


def test_a_non_callable_is_refused():
    with pytest.raises(TypeError, match="expected a preprocessor name, class, instance"):
        build_preprocessor(42)


class LongEnough(Filter):
    def __init__(self, minimum: int) -> None:
        self.minimum = minimum

    def __call__(self, row) -> bool:
        return len(row["text"]) >= self.minimum


def test_filters_register_and_build_like_preprocessors():
    FILTERS.register(LongEnough)
    built = build_filter("LongEnough", {"minimum": 3})
    assert built({"text": "abcd"}) and not built({"text": "ab"})
    assert isinstance(build_filter(lambda row: True), FunctionFilter)
    with pytest.raises(ValueError, match="unknown filter 'Nope'; known: .*LongEnough"):
        build_filter("Nope")


def test_the_base_classes_must_be_implemented():
    with pytest.raises(NotImplementedError, match="must implement __call__"):
        Preprocessor()({})
    with pytest.raises(NotImplementedError, match="must implement __call__"):
        Filter()({})


def test_batch_defaults_to_one_call_per_row():
    rows = [{"query": f"q{i}", "response": "r"} for i in range(3)]
    out = SelfCognitionProcessor("A", "B").batch(rows)
    assert [t.messages[0].content for t in out] == ["q0", "q1", "q2"]


def test_row_field_errors_survive_pickling_out_of_a_worker():
    error = pickle.loads(pickle.dumps(RowFieldError("query", "missing")))
    assert (error.field, error.reason, str(error)) == ("query", "missing", "field 'query': missing")


def test_equal_preprocessors_fingerprint_equal_and_different_ones_differ():
    # Dataset.map relies on this for the datasets cache.
    first = Hasher.hash(SelfCognitionProcessor("A", "B"))
    assert first == Hasher.hash(SelfCognitionProcessor("A", "B"))
    assert first != Hasher.hash(SelfCognitionProcessor("A", "C"))
