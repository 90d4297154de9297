"""MistralTemplate against mistral-common, Mistral's own tokenizer library, token for token:
on the v3 SentencePiece tokenizer mistral-common ships (Mistral 7B Instruct v0.3's), the
built-in and the generic Template on our Mistral format give mistral-common's tokens for
the same conversation, and label exactly the tokens mistral-common writes for each reply."""

import json
from inspect import signature
from pathlib import Path

import mistral_common
import pytest
from mistral_common.protocol.instruct.messages import AssistantMessage
from mistral_common.protocol.instruct.request import ChatCompletionRequest
from mistral_common.protocol.instruct.validator import ValidationMode
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

from twinkle.template import TEMPLATES, HistoryMismatchError, Template

V3 = Path(mistral_common.__file__).parent / "data" / "mistral_instruct_tokenizer_240323.model.v3"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def call(call_id, city):
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": city}},
    }


def two_turns(system):
    head = [{"role": "system", "content": "You help."}] if system else []
    return head + [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there."},
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "It is 5.  "},
    ]


def tool_turns():
    return [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call("abcDEF123", "Paris")]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "And in Rome and Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("ghiJKL456", "Rome"), call("mnoPQR789", "Oslo")],
        },
        {"role": "tool", "tool_call_id": "ghiJKL456", "content": "rain"},
        {"role": "tool", "tool_call_id": "mnoPQR789", "content": "snow"},
        {"role": "assistant", "content": "Rain in Rome, snow in Oslo."},
    ]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tokenizer folder holding mistral-common's v3 SentencePiece model, which
    transformers converts to a fast tokenizer, with our Mistral format as its template."""
    path = tmp_path_factory.mktemp("mistral-v3")
    (path / "tokenizer.model").write_bytes(V3.read_bytes())
    config = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "legacy": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    built_in = TEMPLATES.get("MistralTemplate")(str(path))
    built_in.tokenizer.save_pretrained(str(path))  # the converted tokenizer, loaded faster
    (path / "chat_template.jinja").write_text(built_in.chat_template)
    return path


@pytest.fixture(scope="module")
def templates(folder):
    return [TEMPLATES.get("MistralTemplate")(str(folder)), Template(str(folder))]


@pytest.fixture(scope="module")
def mistral():
    return MistralTokenizer.from_file(str(V3), mode=ValidationMode.finetuning)


def as_mistral(messages):
    """The conversation as mistral-common takes it: arguments as JSON text."""
    converted = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["content"] = None
            message["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": as_json_text(c["function"]["arguments"]),
                    },
                }
                for c in message["tool_calls"]
            ]
        converted.append(message)
    return converted


def as_json_text(arguments):
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def their_tokens(mistral, messages, tools=None):
    request = ChatCompletionRequest(messages=as_mistral(messages), tools=tools)
    return mistral.encode_chat_completion(request).tokens


def their_reply(mistral, message):
    """mistral-common's tokens for one reply (its end-of-turn token included)."""
    reply = AssistantMessage.model_validate(as_mistral([message])[0])
    encode = mistral.instruct_tokenizer.encode_assistant_message
    # Releases before 1.10 also ask whether the reply is continued (prefilled).
    extra = (
        {"continue_message": False} if "continue_message" in signature(encode).parameters else {}
    )
    return encode(reply, is_before_last_user_message=False, **extra)


def trained_runs(labels):
    """The labelled tokens, one list per run of consecutive labelled positions."""
    runs, run = [], []
    for token in [*labels, -100]:
        if token != -100:
            run.append(token)
        elif run:
            runs.append(run)
            run = []
    return runs


@pytest.mark.parametrize("system", [False, True])
def test_the_system_prompt_goes_with_the_last_user_message(templates, mistral, system):
    messages = two_turns(system)
    for template in templates:
        text = template.render({"messages": messages})
        if system:  # on the last user message, as mistral-common's v3 tokenizer writes it
            assert text.count("You help.") == 1
            assert "[INST] You help.\n\nAdd 2 and 3.[/INST]" in text
        turns = "last" if system else "all"
        feature = template.encode({"messages": messages}, train_turns=turns)
        assert feature["input_ids"].tolist() == their_tokens(mistral, messages)
        replies = [m for m in messages if m["role"] == "assistant"]
        expected = [their_reply(mistral, m) for m in replies[-1 if system else 0 :]]
        assert trained_runs(feature["labels"].tolist()) == expected


def test_an_earlier_turn_of_a_row_with_a_system_prompt_is_a_history_mismatch(templates):
    """The system prompt moves to the latest user message, so the first reply was written
    after a prompt the whole conversation no longer has."""
    for template in templates:
        with pytest.raises(HistoryMismatchError, match="assistant turn 0"):
            template.encode({"messages": two_turns(True)})


def test_tool_calls_and_results_are_mistral_commons_tokens(templates, mistral):
    messages = tool_turns()
    row = {"messages": messages, "tools": [TOOL]}
    for template in templates:
        feature = template.encode(row, train_turns="last")
        assert feature["input_ids"].tolist() == their_tokens(mistral, messages, [TOOL])
        assert trained_runs(feature["labels"].tolist()) == [their_reply(mistral, messages[-1])]


def test_the_replies_after_the_last_user_message_are_trained_as_mistral_common_writes_them(
    templates, mistral
):
    """Both calls of the last round and the answer after their results are stable (the
    tool list and system prompt sit before them); an earlier reply was written when the
    tool list stood before an earlier user message, a history mismatch."""
    messages = tool_turns()
    row = {"messages": messages, "tools": [TOOL]}
    replies = [their_reply(mistral, m) for m in messages if m["role"] == "assistant"]
    for template in templates:
        feature = template.encode(row, train_turns=[-2, -1])
        assert feature["input_ids"].tolist() == their_tokens(mistral, messages, [TOOL])
        assert trained_runs(feature["labels"].tolist()) == replies[-2:]
        calls = template.parse_tool_calls(template.decode(replies[-2]))
        assert [c["function"]["arguments"] for c in calls] == [{"city": "Rome"}, {"city": "Oslo"}]
        with pytest.raises(HistoryMismatchError, match="assistant turn 0"):
            template.encode({**row, "messages": messages[1:]}, train_turns=[0])


def test_a_call_turn_with_text_is_refused(templates):
    messages = tool_turns()[:3]
    messages[2] = {**messages[2], "content": "Let me look."}
    for template in templates:
        with pytest.raises(Exception, match="move the text of that assistant message"):
            template.encode({"messages": messages, "tools": [TOOL]})


@pytest.mark.parametrize(
    ("arguments", "result"),
    [
        ('{"city":"Paris"}', '{"temp":20, "sky": ["clear", "dry"]}'),  # compact JSON
        ("Paris", "20"),  # not JSON, and a bare number
        ('"Paris"', "null"),
    ],
)
def test_json_text_in_calls_and_results_is_written_as_mistral_common_writes_it(
    folder, mistral, arguments, result
):
    """mistral-common parses JSON text (arguments given as a string, a tool's result) and
    writes the value it holds; MistralTemplate does the same before rendering."""
    template = TEMPLATES.get("MistralTemplate")(str(folder))
    messages = tool_turns()[:5]
    messages[2] = {**messages[2], "tool_calls": [dict(call("abcDEF123", "Paris"))]}
    messages[2]["tool_calls"][0]["function"] = {"name": "get_weather", "arguments": arguments}
    messages[3] = {**messages[3], "content": result}
    feature = template.encode({"messages": messages, "tools": [TOOL]}, train_turns=[-2, -1])
    assert feature["input_ids"].tolist() == their_tokens(mistral, messages, [TOOL])
    replies = [their_reply(mistral, m) for m in messages if m["role"] == "assistant"]
    assert trained_runs(feature["labels"].tolist()) == replies
