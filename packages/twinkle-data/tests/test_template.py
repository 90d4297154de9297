"""Template labels, checked token by token against references built by hand, and rendering
checked against the tokenizer's own apply_chat_template."""

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.data_format import InputFeature, Message, Trajectory
from twinkle.hub import resolve_model
from twinkle.template import HistoryMismatchError, Qwen3_5Template, Template
from twinkle.template.history import common_prefix_length

TINY = "bundled://tiny-qwen3"
END = "<|im_end|>"
HEADER = "<|im_start|>assistant\n"
# Qwen3 opens the conversation's final reply with a think block, empty when it has none,
# and drops it once the reply is an earlier turn.
THINK = "<think>\n\n</think>\n\n"
KINDS = ["Qwen3_5Template", "Template", "rendered turns"]


def without_generation_blocks(chat_template):
    return chat_template.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")


def make(kind, **kwargs):
    """One of the three ways of finding the assistant's text: ChatML scanning, generation
    blocks, and rendering each reply's turn (the generic Template on the bundled template
    with its generation blocks removed, as every model's own template is)."""
    if kind == "Qwen3_5Template":
        return Qwen3_5Template(TINY, **kwargs)
    if kind == "Template":
        return Template(TINY, **kwargs)
    source = Template(TINY).tokenizer.chat_template
    return Template(TINY, chat_template=without_generation_blocks(source), **kwargs)


@pytest.fixture(scope="module")
def qwen():
    return make("Qwen3_5Template")


@pytest.fixture(scope="module")
def generic():
    return make("Template")


@pytest.fixture(scope="module")
def rendered_turns():
    return make("rendered turns")


@pytest.fixture(scope="module", params=KINDS)
def template(request, qwen, generic, rendered_turns):
    return {"Qwen3_5Template": qwen, "Template": generic}.get(request.param, rendered_turns)


def runs(feature, tokenizer):
    """The labelled tokens as maximal runs, each decoded, after checking token by token
    that labels are unshifted copies of input_ids and that every run sits right after an
    assistant header and right before the newline that ends the turn."""
    ids, labels = feature["input_ids"].tolist(), feature["labels"].tolist()
    assert len(labels) == len(ids)
    found, start = [], None
    for i, (token, label) in enumerate([*zip(ids, labels, strict=True), (None, -100)]):
        if label != -100:
            assert label == token, f"label {i} is {label}, not input_ids[{i}]={token}"
            start = i if start is None else start
        elif start is not None:
            before = tokenizer.decode(ids[:start])
            assert before.endswith(HEADER) or before.endswith(HEADER + THINK), before[-40:]
            assert tokenizer.decode(ids[i : i + 1]) in ("\n", "")
            found.append(tokenizer.decode(ids[start:i]))
            start = None
    return found


def baseline_labels(tokenizer, messages, tools=None, **variables):
    """Labels from transformers' own assistant mask (the template's generation blocks)."""
    out = tokenizer.apply_chat_template(
        messages,
        tools=tools,
        return_dict=True,
        return_assistant_tokens_mask=True,
        **variables,
    )
    ids = np.asarray(out["input_ids"])
    return ids, np.where(np.asarray(out["assistant_masks"]) == 1, ids, -100)


def check(template, trajectory, expected_runs, **variables):
    """Encode; compare with apply_chat_template's text, ids and mask, and with the runs."""
    feature = template.encode(trajectory)
    tok = template.tokenizer
    messages = [Message.model_validate(m).to_openai() for m in trajectory["messages"]]
    tools = trajectory.get("tools")
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, **variables)
    assert template.decode(feature["input_ids"]) == text
    ids, labels = baseline_labels(tok, messages, tools, **variables)
    np.testing.assert_array_equal(feature["input_ids"], ids)
    np.testing.assert_array_equal(feature["labels"], labels)
    np.testing.assert_array_equal(feature["position_ids"], np.arange(len(ids)))
    assert feature["length"] == len(ids)
    assert runs(feature, tok) == expected_runs
    return feature


def test_single_turn(template):
    row = {
        "messages": [
            {"role": "user", "content": "Who are you?"},
            {"role": "assistant", "content": "I am Twinkle."},
        ]
    }
    feature = check(template, row, [THINK + "I am Twinkle." + END])
    assert isinstance(feature, InputFeature)
    assert template.decode(feature["input_ids"]).startswith("<|im_start|>user\nWho are you?")


def test_system_prompt(template):
    row = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ]
    }
    feature = check(template, row, [THINK + "hello" + END])
    assert template.decode(feature["input_ids"]).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n"
    )


def multi_turn():
    messages = [{"role": "system", "content": "sys"}]
    for i in range(3):
        messages += [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": f"answer number {i}, 你好"},
        ]
    return {"messages": messages}


def test_multi_turn_labels_every_assistant_turn(template, capsys):
    """Turn by turn, each earlier reply was its conversation's final one and opened with the
    empty think block, which the whole conversation leaves out: a rewrite that drops no text
    of the conversation, so every turn is trained, as the whole conversation renders it (the
    text the model is shown at inference), with no error and no warning."""
    expected = [f"answer number {i}, 你好{END}" for i in range(2)]
    feature = check(template, multi_turn(), [*expected, f"{THINK}answer number 2, 你好{END}"])
    assert "renders differently" not in capsys.readouterr().err
    assert template.decode(feature["input_ids"]) == template.render(multi_turn())
    # Turn 0 as the latest reply of its conversation does open with the block.
    first = {"messages": multi_turn()["messages"][:3]}
    assert template.render(first).endswith(HEADER + THINK + f"answer number 0, 你好{END}\n")


def test_thinking_on_last_turn_keeps_reasoning(template):
    row = {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "\nadd them\n"},
        ]
    }
    check(template, row, ["<think>\nadd them\n</think>\n\n4" + END])


@pytest.mark.parametrize("kind", KINDS)
def test_thinking_off_without_reasoning(kind):
    """The empty think block is the generation prompt's with enable_thinking=False: the
    reply after it is trained, the block is not."""
    row = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}
    feature = check(make(kind, enable_thinking=False), row, ["4" + END], enable_thinking=False)
    assert make(kind).decode(feature["input_ids"]).endswith(HEADER + THINK + "4" + END + "\n")


def test_enable_thinking_false_adds_empty_think_block_to_generation_prompt():
    prompt = {"messages": [{"role": "user", "content": "2+2?"}]}
    off = Qwen3_5Template(TINY, enable_thinking=False).encode(prompt, add_generation_prompt=True)
    on = Qwen3_5Template(TINY, enable_thinking=True).encode(prompt, add_generation_prompt=True)
    decode = Qwen3_5Template(TINY).decode
    assert decode(off["input_ids"]).endswith(HEADER + "<think>\n\n</think>\n\n")
    assert decode(on["input_ids"]).endswith(HEADER)
    # Training renders the same text either way; with the flag off the empty think block
    # is the prompt's, so it is not trained.
    row = {"messages": [*prompt["messages"], {"role": "assistant", "content": "4"}]}
    check(Qwen3_5Template(TINY, enable_thinking=False), row, ["4" + END], enable_thinking=False)
    check(Qwen3_5Template(TINY, enable_thinking=True), row, [THINK + "4" + END])


@pytest.mark.parametrize(
    ("enable_thinking", "reasoning", "trained"),
    [(None, "add them", "add them\n</think>\n\n4" + END), (False, None, "4" + END)],
)
def test_qwen3_5s_opening_think_tag_is_the_prompts_not_trained(enable_thinking, reasoning, trained):
    """Qwen3.5's generation prompt opens the think block (an empty one with thinking off),
    so Qwen3_5Template on a Qwen3.5 tokenizer trains from after it, as the generic Template
    finds by rendering each turn."""
    model_id = "bundled://tiny-qwen3.5"
    reply = {"role": "assistant", "content": "4"}
    if reasoning:
        reply["reasoning_content"] = reasoning
    row = {"messages": [{"role": "user", "content": "2+2?"}, reply]}
    qwen = Qwen3_5Template(model_id, enable_thinking=enable_thinking)
    feature = qwen.encode(row)
    expected = Template(model_id, enable_thinking=enable_thinking).encode(row)
    assert feature["labels"].tolist() == expected["labels"].tolist()
    assert qwen.decode(feature["input_ids"][feature["labels"] != -100]) == trained


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def tool_conversation():
    return {
        "messages": [
            {"role": "system", "content": "You help."},
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    },
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                    },
                ],
            },
            {"role": "tool", "content": "sunny"},
            {"role": "tool", "content": "rainy"},
            {"role": "assistant", "content": "Paris is sunny, Rome is rainy."},
        ],
        "tools": [TOOL],
    }


def test_tool_calls_are_trained_and_tool_responses_are_not(template):
    # No newline before the first call of a reply with no text.
    calls = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    )
    feature = check(
        template,
        tool_conversation(),
        [calls + END, THINK + "Paris is sunny, Rome is rainy." + END],
    )
    text = template.decode(feature["input_ids"])
    # Tool schemas go into the system turn; both results share one user turn.
    assert text.startswith(
        "<|im_start|>system\nYou help.\n\n# Tools\n\nYou may call one or more functions to "
        "assist with the user query.\n\nYou are provided with function signatures within "
        "<tools></tools> XML tags:\n<tools>\n"
    )
    assert (
        "</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris and Rome?"
    ) in text
    assert json.dumps(TOOL, ensure_ascii=False) in text
    assert (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nrainy\n</tool_response><|im_end|>\n"
    ) in text


def reasoning_conversation():
    return {
        "messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "one", "reasoning_content": "think one"},
            {"role": "user", "content": "second"},
            {"role": "assistant", "content": "two", "reasoning_content": "think two"},
        ]
    }


def test_dropped_reasoning_of_an_earlier_turn_is_a_history_mismatch(template):
    with pytest.raises(HistoryMismatchError, match="assistant turn 0 ") as caught:
        template.encode(reasoning_conversation())
    assert "think one" in str(caught.value)  # the turn-by-turn rendering keeps it
    assert caught.value.index == 0


def test_history_mismatch_warn_labels_the_whole_rendering(capsys):
    template = Qwen3_5Template(TINY, history_mismatch="warn")
    feature = template.encode(reasoning_conversation())
    assert "assistant turn 0 renders differently" in capsys.readouterr().err
    # Exactly the tokens of the whole rendering: turn 0 without its reasoning.
    assert runs(feature, template.tokenizer) == [
        "one" + END,
        "<think>\nthink two\n</think>\n\ntwo" + END,
    ]
    assert "think one" not in template.decode(feature["input_ids"])


def test_training_only_the_last_turn_needs_no_history(template):
    feature = template.encode(reasoning_conversation(), train_turns="last")
    assert runs(feature, template.tokenizer) == ["<think>\nthink two\n</think>\n\ntwo" + END]


def three_turns():
    messages = []
    for i in range(3):
        messages += [
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": f"a{i}"},
        ]
    return {"messages": messages}


@pytest.mark.parametrize(
    ("train_turns", "expected"),
    [("all", [0, 1, 2]), ("last", [2]), ([0], [0]), ([-1, 0], [0, 2]), ((1,), [1])],
)
def test_train_turns_choose_the_labelled_turns(template, train_turns, expected):
    feature = template.encode(three_turns(), train_turns=train_turns)
    assert runs(feature, template.tokenizer) == [
        f"{THINK if i == 2 else ''}a{i}{END}" for i in expected
    ]


def test_train_turns_default_comes_from_the_template():
    template = Qwen3_5Template(TINY, train_turns="last")
    assert runs(template.encode(three_turns()), template.tokenizer) == [THINK + "a2" + END]
    assert len(runs(template.encode(three_turns(), train_turns="all"), template.tokenizer)) == 3


def test_default_system_is_added_only_when_missing():
    template = Qwen3_5Template(TINY, default_system="You are Twinkle.")
    plain = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    }
    feature = template.encode(plain)
    text = template.decode(feature["input_ids"])
    assert text.startswith("<|im_start|>system\nYou are Twinkle.<|im_end|>\n<|im_start|>user\nhi")
    assert runs(feature, template.tokenizer) == [THINK + "yo" + END]
    assert [m.role for m in feature.messages] == ["user", "assistant"]  # the trajectory as given
    own = {"messages": [{"role": "system", "content": "Mine."}, *plain["messages"]]}
    assert "You are Twinkle." not in template.decode(template.encode(own)["input_ids"])


def test_generation_prompt_has_no_labels_and_ends_with_the_assistant_header(template):
    trajectory = Trajectory(
        messages=[
            Message(role="system", content="You are helpful"),
            Message(role="user", content="Who are you?"),
        ],
        user_data=[{"answer": 42}],
    )
    feature = template.batch_encode([trajectory], add_generation_prompt=True)[0]
    assert feature.labels is None
    text = template.decode(feature["input_ids"])
    expected = template.tokenizer.apply_chat_template(
        [m.to_openai() for m in trajectory.messages], tokenize=False, add_generation_prompt=True
    )
    assert text == expected and text.endswith("Who are you?<|im_end|>\n" + HEADER)
    np.testing.assert_array_equal(feature["position_ids"], np.arange(feature["length"]))
    assert feature.user_data == [{"answer": 42}] and feature.messages == trajectory.messages


def test_feature_carries_the_trajectory_and_ignores_other_columns(template):
    row = {
        **tool_conversation(),
        "user_data": [{"ground_truth": "sunny"}],
        "id": 7,
        "source": "unit test",
    }
    feature = template.encode(row)
    assert feature.user_data == [{"ground_truth": "sunny"}]
    assert [m.role for m in feature.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert feature.tools[0].name == "get_weather"
    assert "id" not in feature and "source" not in feature


def test_none_valued_keys_count_as_absent(template):
    """Rows read back from Arrow carry None for every key another row had."""
    row = {
        "messages": [
            {"role": "user", "content": "hi", "tool_calls": None, "reasoning_content": None},
            {"role": "assistant", "content": "yo", "tool_calls": None, "reasoning_content": None},
        ],
        "tools": None,
        "user_data": None,
    }
    assert runs(template.encode(row), template.tokenizer) == [THINK + "yo" + END]


def test_batch_encode_equals_encode_row_by_row(template):
    rows = [three_turns(), tool_conversation(), reasoning_conversation()]
    batch = template.batch_encode(rows, train_turns="last")
    assert batch == [template.encode(row, train_turns="last") for row in rows]


def test_render_matches_apply_chat_template(template):
    row = tool_conversation()
    messages = [Message.model_validate(m).to_openai() for m in row["messages"]]
    expected = template.tokenizer.apply_chat_template(messages, tools=row["tools"], tokenize=False)
    assert template.render(row) == expected


def test_decode_round_trip(template):
    feature = template.encode(tool_conversation())
    text = template.render(tool_conversation())
    assert template.decode(feature["input_ids"]) == text
    assert template.decode(feature["input_ids"].tolist()) == text
    assert (
        template.tokenizer(text, add_special_tokens=False)["input_ids"]
        == feature["input_ids"].tolist()
    )
    plain = template.decode(feature["input_ids"], skip_special_tokens=True)
    assert "<|im_start|>" not in plain and END not in plain and "<tool_call>" in plain


def test_qwen_template_without_generation_blocks_labels_the_same(rendered_turns):
    """Qwen's own templates have no generation blocks: ChatML scanning and the generic
    Template (rendering each reply's turn) must label exactly what the blocks mark."""
    source = Template(TINY).tokenizer.chat_template
    assert "{%- generation" in source and "generation %}" not in rendered_turns.chat_template
    scanned = Qwen3_5Template(TINY, chat_template=rendered_turns.chat_template)
    marked = Template(TINY)
    rows = [three_turns(), tool_conversation(), reasoning_conversation()]
    for row in rows:
        assert scanned.encode(row, train_turns="last") == marked.encode(row, train_turns="last")
        assert rendered_turns.encode(row, train_turns="last") == marked.encode(
            row, train_turns="last"
        )
    for row in (three_turns(), tool_conversation()):
        assert rendered_turns.encode(row) == marked.encode(row)
    prompt = {"messages": [{"role": "user", "content": "hi"}]}
    assert rendered_turns.encode(prompt, add_generation_prompt=True) == marked.encode(
        prompt, add_generation_prompt=True
    )


def test_a_local_folder_works_like_its_id(qwen):
    folder = resolve_model(TINY)
    assert Path(folder, "tokenizer.json").is_file()
    local = Qwen3_5Template(str(folder))
    assert local.encode(tool_conversation()) == qwen.encode(tool_conversation())


def test_a_tokenizer_with_a_tool_use_template_uses_it_for_rows_with_tools(qwen, tmp_path):
    """As apply_chat_template does: named templates, 'tool_use' picked when tools are given."""
    tokenizer = Template(TINY).tokenizer
    default = tokenizer.chat_template
    tokenizer.chat_template = {
        "default": default,
        "tool_use": default.replace("# Tools", "# Functions"),
    }
    tokenizer.save_pretrained(tmp_path)
    template = Qwen3_5Template(str(tmp_path))
    assert "# Functions" in template.render(tool_conversation())
    assert template.encode(three_turns()) == qwen.encode(three_turns())
    named = Qwen3_5Template(str(tmp_path), chat_template="tool_use")
    assert named.chat_template == tokenizer.chat_template["tool_use"]


def test_template_pickles_for_worker_processes(qwen):
    clone = pickle.loads(pickle.dumps(qwen))
    assert clone.encode(tool_conversation()) == qwen.encode(tool_conversation())


TEXT = st.text(
    alphabet=st.sampled_from(
        list("abcXYZ 019\n\t.,!?{}\"'<>/-_") + ["你", "好", "世", "界", "é", "🙂"]
    ),
    max_size=40,
)


@st.composite
def conversations(draw):
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(TEXT)})
    turns = draw(st.integers(1, 3))
    for turn in range(turns):
        messages.append({"role": "user", "content": draw(TEXT)})
        reply = {"role": "assistant", "content": draw(TEXT)}
        if turn == turns - 1 and draw(st.booleans()):
            reply["reasoning_content"] = draw(TEXT)
        messages.append(reply)
    return messages


def expected_reply(message, final):
    """Earlier replies as they are; the final one after its think block (empty without
    reasoning), its text's leading newlines dropped."""
    if not final:
        return message["content"] + END
    reasoning = message.get("reasoning_content", "").strip("\n")
    return f"<think>\n{reasoning}\n</think>\n\n" + message["content"].lstrip("\n") + END


@settings(max_examples=60, deadline=None)
@given(messages=conversations())
def test_labels_on_random_conversations(qwen, generic, rendered_turns, messages):
    expected = [
        expected_reply(m, i == len(messages) - 1)
        for i, m in enumerate(messages)
        if m["role"] == "assistant"
    ]
    for template in (qwen, generic, rendered_turns):
        check(template, {"messages": messages}, expected)


@given(st.text(alphabet="ab<>", max_size=40), st.text(alphabet="ab<>", max_size=40))
@settings(max_examples=300, deadline=None)
def test_common_prefix_length_is_the_shared_leading_characters(a, b):
    n = common_prefix_length(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]
