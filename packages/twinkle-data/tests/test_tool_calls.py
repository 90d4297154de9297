"""Tool calls both ways: a call rendered by a chat template parses back to the same call,
each format parses the text its models write, and malformed calls are named."""

import pytest

from twinkle.template import Template
from twinkle.template.tool_calls import (
    TOOL_CALL_FORMATS,
    ToolCallError,
    detect_tool_call_format,
)

TINY = "bundled://tiny-qwen3"
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.fixture(scope="module")
def template():
    return Template(TINY)


def generated_reply(template, messages, tools):
    """What the template renders for the last assistant turn: the text a model writes."""
    row = {"messages": messages[:-1], "tools": tools}
    prompt = template.render(row, add_generation_prompt=True)
    whole = template.render({"messages": messages, "tools": tools})
    assert whole.startswith(prompt)
    return whole[len(prompt) :].split("<|im_end|>")[0] + "<|im_end|>"


def test_the_bundled_template_writes_hermes_calls(template):
    assert template.tool_call_format.name == "hermes"
    assert template.stop_tokens == ("<|im_end|>",)


def test_a_rendered_call_parses_back_to_the_message(template):
    reply = {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [call("get_weather", city="Paris"), call("get_weather", city="北京")],
    }
    messages = [{"role": "user", "content": "Weather?"}, reply]
    text = generated_reply(template, messages, [TOOL])
    # Qwen3 writes an empty think block before a final reply without reasoning.
    assert text.startswith("<think>\n\n</think>\n\nLet me look.\n<tool_call>")
    assert template.parse_response(text) == {**reply, "reasoning_content": ""}
    assert template.parse_tool_calls(text) == reply["tool_calls"]
    # The parsed message renders back to the same text: an agent loop can append it.
    again = [messages[0], template.parse_response(text)]
    assert generated_reply(template, again, [TOOL]) == text


def test_reasoning_and_content_without_calls(template):
    text = "<think>\nThe user greets.\n</think>\n\nHello!<|im_end|>"
    assert template.parse_response(text) == {
        "role": "assistant",
        "reasoning_content": "The user greets.",
        "content": "Hello!",
    }
    assert template.parse_tool_calls("Hello!") == []


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {"x": 1}\n</tool_call>', "not valid JSON"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "no function name"),
        ('<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>', "not a JSON object"),
        ('<tool_call>\n{"name": "f", "arguments": {}}', "never closes"),
    ],
)
def test_malformed_hermes_calls_are_named(template, text, match):
    with pytest.raises(ToolCallError, match=match) as info:
        template.parse_tool_calls(text)
    assert "{" in info.value.text


FORMAT_CASES = {
    "hermes": (
        'Sure.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
        "Sure.",
        [call("f", x=1)],
    ),
    "qwen_xml": (
        "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n<parameter=city>\n"
        "Rome\n</parameter>\n</function>\n</tool_call>",
        "",
        [call("f", x=1, city="Rome")],
    ),
    "glm45": (
        "ok<tool_call>f\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
        "ok",
        [call("f", x=1)],
    ),
    "phi4_mini": (
        '<|tool_call|>[{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}]'
        "<|/tool_call|>",
        "",
        [call("f", x=1), call("g")],
    ),
    "llama3_json": (
        '{"name": "f", "parameters": {"x": "a;b"}}; {"name": "g", "parameters": {}}',
        "",
        [call("f", x="a;b"), call("g")],
    ),
    "mistral": (
        'Hm[TOOL_CALLS][{"name": "f", "arguments": {"x": 1}, "id": "abc123def"}]',
        "Hm",
        [{**call("f", x=1), "id": "abc123def"}],
    ),
    "deepseek": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
        '{"x": 1}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "",
        [call("f", x=1), call("g")],
    ),
}


@pytest.mark.parametrize("name", sorted(FORMAT_CASES))
def test_each_format_parses_its_models_text(name):
    text, content, calls = FORMAT_CASES[name]
    assert TOOL_CALL_FORMATS.get(name)().parse(text) == (content, calls)


def test_every_registered_format_has_a_case():
    assert sorted(FORMAT_CASES) == TOOL_CALL_FORMATS.names()


def test_mistral_v11_calls_and_plain_text():
    parse = TOOL_CALL_FORMATS.get("mistral")().parse
    assert parse('[TOOL_CALLS]f[ARGS]{"x": 1}[TOOL_CALLS]g[ARGS]{}') == (
        "",
        [call("f", x=1), call("g")],
    )
    assert parse("no calls here") == ("no calls here", [])
    with pytest.raises(ToolCallError, match="neither a list nor"):
        parse("[TOOL_CALLS]f")


def test_llama3_plain_reply_is_content():
    parse = TOOL_CALL_FORMATS.get("llama3_json")().parse
    assert parse("The answer is {x}.") == ("The answer is {x}.", [])
    assert parse('<|python_tag|>{"name": "f", "parameters": {}}') == ("", [call("f")])


def test_detection_prefers_the_most_specific_markers():
    assert detect_tool_call_format("<tool_call>\n<function=x>").name == "qwen_xml"
    assert detect_tool_call_format("<tool_call>{{ name }}<arg_key>").name == "glm45"
    assert detect_tool_call_format("{{ '<tool_call>' }}").name == "hermes"
    assert detect_tool_call_format("{{ bos_token }}{{ content }}") is None


def test_an_unknown_format_lists_the_known_ones():
    with pytest.raises(ValueError, match="known: deepseek, glm45, hermes"):
        Template(TINY, tool_call_format="nope")


def test_a_template_without_a_tool_format_says_how_to_choose_one(tmp_path):
    plain = Template(TINY, chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    assert plain.tool_call_format is None
    with pytest.raises(ValueError, match="pass tool_call_format="):
        plain.parse_tool_calls("x")
    chosen = Template(TINY, chat_template="{{ messages }}", tool_call_format="mistral")
    assert chosen.parse_tool_calls('[TOOL_CALLS][{"name": "f", "arguments": {}}]') == [call("f")]
