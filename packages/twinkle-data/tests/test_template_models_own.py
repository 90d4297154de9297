"""Built-in formats against the models' own chat templates, as the trl package ships them
byte for byte (``trl/chat_templates``): on the bundled tiny tokenizer of the family, the
built-in Template and the generic Template on the model's template render the same text
and give the same tokens and labels, or differ exactly where the built-in means to."""

import importlib.util
import re
from pathlib import Path

import pytest

from twinkle.template import TEMPLATES, HistoryMismatchError, Template

TRL_TEMPLATES = Path(importlib.util.find_spec("trl").origin).parent / "chat_templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


def call(**arguments):
    return {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}


def with_tools(messages):
    return {"messages": messages, "tools": [WEATHER]}


QWEN3_5_ROWS = {
    "system, a call, its result, the answer": with_tools(
        [
            {"role": "system", "content": "You help."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [call(city="Paris")]},
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ]
    ),
    "no system, text before two calls, arguments of every kind": with_tools(
        [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "Looking both up.",
                "tool_calls": [
                    # Not in sorted order: the format keeps the arguments' order.
                    call(units={"temp": "C"}, city="Paris", days=3, hourly=True),
                    call(city="Rome", hours=[6, 12], note=None),
                ],
            },
            {"role": "tool", "content": "sunny"},
            {"role": "tool", "content": "rain"},
            {"role": "assistant", "content": "Sunny in Paris, rain in Rome."},
        ]
    ),
    "reasoning, several steps, a second question": with_tools(
        [
            {"role": "system", "content": "  You help.\n"},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "reasoning_content": "I should look it up.",
                "content": "",
                "tool_calls": [call(city="Paris")],
            },
            {"role": "tool", "content": "sunny"},
            {
                "role": "assistant",
                "content": "<think>\nAnd tomorrow?\n</think>\n\n",
                "tool_calls": [call(city="Paris", days=2)],
            },
            {"role": "tool", "content": "rain"},
            {"role": "assistant", "content": "Sunny, then rain."},
        ]
    ),
}


def qwen3_5_pair(own_file, **settings):
    model_id = "bundled://tiny-qwen3.5"
    own = Template(model_id, chat_template=(TRL_TEMPLATES / own_file).read_text(), **settings)
    return TEMPLATES.get("Qwen3_5FormatTemplate")(model_id, **settings), own


def prompt_of(row):
    last = max(i for i, m in enumerate(row["messages"]) if m["role"] == "assistant")
    return {**row, "messages": row["messages"][:last]}


@pytest.mark.parametrize(
    ("own_file", "settings"),
    [
        ("qwen3_5_think.jinja", {}),
        ("qwen3_5_think.jinja", {"enable_thinking": False}),
        ("qwen3_5_nothink.jinja", {"enable_thinking": False}),
    ],
)
@pytest.mark.parametrize("title", sorted(QWEN3_5_ROWS))
def test_qwen3_5_tool_trajectories_are_the_models_own(own_file, settings, title):
    built_in, own = qwen3_5_pair(own_file, **settings)
    row = QWEN3_5_ROWS[title]
    assert built_in.render(row) == own.render(row)
    prompt = prompt_of(row)
    generation = built_in.render(prompt, add_generation_prompt=True)
    assert generation == own.render(prompt, add_generation_prompt=True)
    if settings and any("reasoning_content" in m for m in row["messages"]):
        # Reasoning with thinking off: the prompt's empty think block is not how the reply
        # opens, in either template, so neither labels it (a clear error, not wrong labels).
        for template in (built_in, own):
            with pytest.raises(HistoryMismatchError, match="generation prompt reads"):
                template.encode(row)
        return
    ours, theirs = built_in.encode(row), own.encode(row)
    assert ours["input_ids"].tolist() == theirs["input_ids"].tolist()
    assert ours["labels"].tolist() == theirs["labels"].tolist()
    # Every reply is trained, its calls with it, each through its <|im_end|>.
    trained = built_in.decode([t for t in ours["labels"] if t != -100])
    replies = [m for m in row["messages"] if m["role"] == "assistant"]
    assert trained.count("<|im_end|>") == len(replies)
    assert trained.count("<function=get_weather>") == sum(
        len(m.get("tool_calls", [])) for m in replies
    )


def test_qwen3_5_writes_each_argument_as_the_models_template_does():
    built_in, _ = qwen3_5_pair("qwen3_5_think.jinja")
    text = built_in.render(
        QWEN3_5_ROWS["no system, text before two calls, arguments of every kind"]
    )
    first = (
        "Looking both up.\n\n<tool_call>\n<function=get_weather>\n"
        '<parameter=units>\n{"temp": "C"}\n</parameter>\n<parameter=city>\nParis\n</parameter>\n'
        "<parameter=days>\n3\n</parameter>\n<parameter=hourly>\nTrue\n</parameter>\n"
        "</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
    )
    assert first in text
    assert "<parameter=hours>\n[6, 12]\n</parameter>" in text
    # The system prompt follows the tool guide, trimmed.
    tools_turn = built_in.render(QWEN3_5_ROWS["reasoning, several steps, a second question"])
    assert "</IMPORTANT>\n\nYou help.<|im_end|>" in tools_turn


def test_qwen3_5_refuses_arguments_given_as_json_text():
    built_in, _ = qwen3_5_pair("qwen3_5_think.jinja")
    row = QWEN3_5_ROWS["system, a call, its result, the answer"]
    messages = [dict(m) for m in row["messages"]]
    messages[2]["tool_calls"] = [
        {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    with pytest.raises(Exception, match="as a dict, not a JSON string"):
        built_in.encode({**row, "messages": messages})


DEEPSEEK_ROWS = {
    "two system prompts, two turns": {
        "messages": [
            {"role": "system", "content": "You help."},
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "<think>\nA greeting.\n</think>\n\nHi there."},
            {"role": "user", "content": "Add 2 and 3."},
            {"role": "assistant", "content": "It is 5.", "reasoning_content": "2 + 3 = 5"},
        ]
    },
    "a call, its result, the answer": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ],
        "tools": [WEATHER],
    },
}
_THINK = re.compile(r"(?<=<｜Assistant｜>)<think>\n.*?\n</think>\n\n", re.DOTALL)


def deepseek_pair(**settings):
    model_id = "bundled://tiny-deepseek-v3"
    source = (TRL_TEMPLATES / "deepseekv3.jinja").read_text()
    own = Template(model_id, chat_template=source, **settings)
    return TEMPLATES.get("DeepSeekV3Template")(model_id, **settings), own


@pytest.mark.parametrize("title", sorted(DEEPSEEK_ROWS))
def test_deepseek_thinking_opens_the_models_think_block_and_trains_what_follows(title):
    """Thinking (the default): the generation prompt is the model's, ``<think>\\n`` included,
    and each reply after it is trained as its continuation; the model's template writes the
    same text but for the think blocks of those replies."""
    built_in, own = deepseek_pair()
    row = DEEPSEEK_ROWS[title]
    prompt = prompt_of(row)
    generation = built_in.render(prompt, add_generation_prompt=True)
    assert _THINK.sub("", generation) == own.render(prompt, add_generation_prompt=True)
    text = built_in.render(row)
    assert _THINK.sub("", text) == own.render(row)
    feature = built_in.encode(row, train_turns="last")
    assert built_in.decode(feature["input_ids"]) == text
    trained = built_in.decode([t for t in feature["labels"] if t != -100])
    last = row["messages"][-1]
    if generation.endswith("<think>\n"):  # the reply continues the prompt's think block
        assert text.startswith(generation)
        assert (
            trained
            == f"{last['reasoning_content']}\n</think>\n\n{last['content']}<｜end▁of▁sentence｜>"
        )
    else:  # after tool results the model answers straight away
        assert trained == f"{last['content']}<｜end▁of▁sentence｜>"


@pytest.mark.parametrize("title", sorted(DEEPSEEK_ROWS))
def test_deepseek_without_thinking_renders_the_models_text(title):
    """enable_thinking=False (V3 as a chat model): every reply as the model's template
    writes it, labelled exactly; only the generation prompt opens no think block."""
    built_in, own = deepseek_pair(enable_thinking=False)
    row = DEEPSEEK_ROWS[title]
    assert built_in.render(row) == own.render(row)
    prompt = prompt_of(row)
    generation = built_in.render(prompt, add_generation_prompt=True)
    theirs = own.render(prompt, add_generation_prompt=True)
    assert generation in (theirs, theirs.removesuffix("<think>\n"))
    assert not generation.endswith("<think>\n")
    feature = built_in.encode(row, train_turns="last")
    trained = built_in.decode([t for t in feature["labels"] if t != -100])
    assert trained == row["messages"][-1]["content"] + "<｜end▁of▁sentence｜>"
