"""Every bundled family, token by token: the generic Template (rendering each reply's turn,
as the model folders' templates have no generation blocks) and the family's built-in
Template against renderings written here from each format's description, piece by piece:
the expected input_ids are the pieces' tokens joined and the labels exactly the reply
pieces' tokens (each reply with its end-of-turn token)."""

import json

import pytest

from twinkle.template import TEMPLATES, HistoryMismatchError, Template

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CALL_JSON = '{"city": "Paris"}'


def system_user_reply():
    return [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Who are you?"},
        {"role": "assistant", "content": "I am a tiny model."},
    ]


def two_turns():
    return [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there."},
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "It is 5."},
    ]


def tool_turns():
    return [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]


def thinking_turn():
    return [
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "reasoning_content": "2 plus 3.", "content": "5"},
    ]


# Each format: messages -> [(text, trained)], written from the format's description.


def llama3(messages, tools):
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    rest = messages[1:] if messages[0]["role"] == "system" else messages
    head = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    if tools:
        head += "Environment: ipython\n"
    head += "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
    pieces = [(head + system + "<|eot_id|>", False)]
    if tools:  # in the first user turn, as Llama 3.1's template puts them by default
        guide = (
            "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, "
            "please respond with a JSON for a function call with its proper arguments that "
            'best answers the given prompt.\n\nRespond in the format {"name": function name, '
            '"parameters": dictionary of argument name and its value}.Do not use variables.\n\n'
        )
        guide += "".join(json.dumps(t, indent=4) + "\n\n" for t in tools)
        pieces.append((guide + rest[0]["content"] + "<|eot_id|>", False))
        rest = rest[1:]
    for m in rest:
        if m["role"] == "assistant":
            pieces.append(("<|start_header_id|>assistant<|end_header_id|>\n\n", False))
            if m.get("tool_calls"):
                body = f'{{"name": "get_weather", "parameters": {CALL_JSON}}}'
            else:
                body = m["content"]
            pieces.append((body + "<|eot_id|>", True))
        else:
            role, content = m["role"], m["content"]
            if role == "tool":  # a result is written as JSON, a string in quotes
                role, content = "ipython", json.dumps(content)
            pieces.append(
                (f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>", False)
            )
    return pieces


def mistral(messages, tools):
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    rest = messages[1:] if system else messages
    last_user = max(i for i, m in enumerate(rest) if m["role"] == "user")
    pieces = [("<s>", False)]
    for i, m in enumerate(rest):
        if m["role"] == "user":
            text = (
                f"[AVAILABLE_TOOLS] {json.dumps(tools)}[/AVAILABLE_TOOLS]"
                if tools and i == last_user
                else ""
            )
            content = f"{system}\n\n{m['content']}" if system and i == last_user else m["content"]
            pieces.append((f"{text}[INST] {content}[/INST]", False))
        elif m["role"] == "tool":
            pieces.append((f'[TOOL_RESULTS] {{"content": "{m["content"]}"}}[/TOOL_RESULTS]', False))
        elif m.get("tool_calls"):
            pieces.append(
                (f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {CALL_JSON}}}]</s>', True)
            )
        else:
            pieces.append((" " + m["content"] + "</s>", True))
    return pieces


def gemma3(messages, tools):
    assert not tools
    prefix = messages[0]["content"] + "\n\n" if messages[0]["role"] == "system" else ""
    rest = messages[1:] if prefix else messages
    pieces = [("<bos>", False)]
    for i, m in enumerate(rest):
        content = (prefix if i == 0 else "") + m["content"]
        if m["role"] == "assistant":
            pieces += [
                ("<start_of_turn>model\n", False),
                (content + "<end_of_turn>", True),
                ("\n", False),
            ]
        else:
            pieces.append((f"<start_of_turn>user\n{content}<end_of_turn>\n", False))
    return pieces


def deepseek_v3(messages, tools, thinking=True):
    """Thinking (the default): the generation prompt opens ``<think>\n``, and each reply after
    the last user message that follows it is written as the model writes it there."""
    assert not tools
    pieces = [("<｜begin▁of▁sentence｜>", False)]
    pieces += [(m["content"], False) for m in messages if m["role"] == "system"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    for i, m in enumerate(messages):
        if m["role"] == "user":
            pieces.append(("<｜User｜>" + m["content"], False))
        elif m["role"] == "tool":
            pieces.append(
                (
                    f"<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{m['content']}<｜tool▁output▁end｜>",
                    False,
                )
            )
        elif m["role"] == "assistant":
            after_tool = messages[i - 1]["role"] == "tool"
            body = m["content"]
            if after_tool:
                header = "<｜tool▁outputs▁end｜>"
            elif thinking and i > last_user:
                header = "<｜Assistant｜><think>\n"
                body = f"{m.get('reasoning_content', '')}\n</think>\n\n{body}"
            else:
                header = "<｜Assistant｜>"
            pieces.append((header, False))
            if m.get("tool_calls"):
                body += (
                    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                    f"```json\n{CALL_JSON}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
                )
            pieces.append((body + "<｜end▁of▁sentence｜>", True))
    return pieces


def glm4(messages, tools):
    assert not tools
    pieces = [("[gMASK]<sop>", False)]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    for i, m in enumerate(messages):
        if m["role"] in ("system", "user"):
            pieces.append((f"<|{m['role']}|>\n{m['content']}", False))
        elif m["role"] == "tool":
            pieces.append(
                (f"<|observation|>\n<tool_response>\n{m['content']}\n</tool_response>", False)
            )
        else:
            think = m.get("reasoning_content", "") if i > last_user else ""
            body = f"\n<think>{think}</think>"
            if m["content"]:
                body += "\n" + m["content"]
            if m.get("tool_calls"):
                body += (
                    "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                    "<arg_value>Paris</arg_value>\n</tool_call>"
                )
            pieces += [("<|assistant|>", False), (body, True)]
    return pieces


def phi4(messages, tools):
    assert not tools
    pieces = []
    for m in messages:
        header = f"<|im_start|>{m['role']}<|im_sep|>"
        if m["role"] == "assistant":
            pieces += [(header, False), (m["content"] + "<|im_end|>", True)]
        else:
            pieces.append((header + m["content"] + "<|im_end|>", False))
    return pieces


def chatml(default_system, reasoning_format):
    """Qwen's ChatML: ``reasoning_format`` 'qwen3_5' writes a think block (possibly empty)
    on every turn after the last user message; 'qwen3' on the final message (empty without
    reasoning) and on earlier turns after the last user message that have reasoning; None
    writes none."""

    def render(messages, tools):
        pieces = []
        system = messages[0]["content"] if messages[0]["role"] == "system" else default_system
        if tools:
            raise AssertionError("tools are checked by test_tool_calls_render_and_parse_back")
        if system is not None:
            pieces.append((f"<|im_start|>system\n{system}<|im_end|>\n", False))
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        for i, m in enumerate(messages):
            if m["role"] == "user":
                pieces.append((f"<|im_start|>user\n{m['content']}<|im_end|>\n", False))
            elif m["role"] == "tool":
                pieces.append(
                    (
                        f"<|im_start|>user\n<tool_response>\n{m['content']}\n</tool_response><|im_end|>\n",
                        False,
                    )
                )
            elif m["role"] == "assistant":
                think = ""
                # Qwen3.5 on every turn after the last user message; Qwen3 there only on
                # the final message and on turns with reasoning.
                final = i == len(messages) - 1
                writes = reasoning_format == "qwen3_5" or (
                    reasoning_format == "qwen3" and (final or m.get("reasoning_content"))
                )
                if writes and i > last_user:
                    think = f"<think>\n{m.get('reasoning_content', '')}\n</think>\n\n"
                body = m["content"]
                if m.get("tool_calls") and reasoning_format == "qwen3_5":
                    body += (
                        "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                        "</parameter>\n</function>\n</tool_call>"
                    )
                elif m.get("tool_calls"):
                    body += (
                        ("\n" if body else "")
                        + f'<tool_call>\n{{"name": "get_weather", "arguments": {CALL_JSON}}}'
                        + "\n</tool_call>"
                    )
                header = "<|im_start|>assistant\n"
                if reasoning_format == "qwen3_5":
                    # The generation prompt opens the think block, so the reply starts inside it.
                    pieces += [
                        (header + think[: len("<think>\n")], False),
                        (think[len("<think>\n") :] + body + "<|im_end|>", True),
                    ]
                else:
                    pieces += [(header, False), (think + body + "<|im_end|>", True)]
                pieces.append(("\n", False))
        return pieces

    return render


QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
FAMILIES = {
    # folder: (format, built-in template, conversations whose every turn is stable)
    "tiny-llama3": (llama3, "Llama3Template", [system_user_reply, two_turns, tool_turns]),
    "tiny-mistral": (mistral, "MistralTemplate", [system_user_reply, two_turns]),
    "tiny-gemma3": (gemma3, "Gemma3Template", [system_user_reply, two_turns]),
    "tiny-deepseek-v3": (
        deepseek_v3,
        "DeepSeekV3Template",
        [system_user_reply, two_turns, tool_turns, thinking_turn],
    ),
    "tiny-glm4.5": (
        glm4,
        "Glm4Template",
        [system_user_reply, two_turns, tool_turns, thinking_turn],
    ),
    "tiny-phi4": (phi4, "Phi4Template", [system_user_reply, two_turns]),
    "tiny-qwen2.5": (
        chatml(QWEN25_SYSTEM, None),
        "Qwen2_5Template",
        [system_user_reply, two_turns, tool_turns],
    ),
    "tiny-qwen3": (
        chatml(None, "qwen3"),
        "Qwen3Template",
        [system_user_reply, two_turns, tool_turns, thinking_turn],
    ),
    "tiny-qwen3-moe": (chatml(None, "qwen3"), "Qwen3Template", [two_turns, thinking_turn]),
    "tiny-qwen3.5": (
        chatml(None, "qwen3_5"),
        "Qwen3_5FormatTemplate",
        [system_user_reply, two_turns, thinking_turn],
    ),
    "tiny-qwen3.5-moe": (chatml(None, "qwen3_5"), "Qwen3_5FormatTemplate", [thinking_turn]),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    folder = request.param
    fmt, built_in, conversations = FAMILIES[folder]
    model_id = f"bundled://{folder}"
    templates = [Template(model_id), TEMPLATES.get(built_in)(model_id)]
    source = templates[0].chat_template
    bare = source.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
    if bare != source:  # the bundled Qwen3 format marks replies; models' templates do not
        templates.append(Template(model_id, chat_template=bare))
    return fmt, conversations, tuple(templates)


def expected_feature(tokenizer, pieces):
    ids, labels = [], []
    for text, trained in pieces:
        piece = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += piece
        labels += piece if trained else [-100] * len(piece)
    whole = tokenizer("".join(text for text, _ in pieces), add_special_tokens=False)["input_ids"]
    assert ids == whole, "the pieces must split the text where its tokens split"
    return ids, labels


def test_every_turn_is_labelled_exactly(family):
    fmt, conversations, templates = family
    assert not templates[-1]._generation_blocks[False]
    for template in templates:
        for conversation in conversations:
            pieces = fmt(conversation(), None)
            ids, labels = expected_feature(template.tokenizer, pieces)
            feature = template.encode({"messages": conversation()})
            assert template.render({"messages": conversation()}) == "".join(t for t, _ in pieces)
            assert feature["input_ids"].tolist() == ids
            assert feature["labels"].tolist() == labels, (type(template).__name__, conversation)


def test_the_generation_prompt_is_what_precedes_the_reply(family):
    fmt, _, templates = family
    messages = system_user_reply()
    pieces = fmt(messages, None)
    prompt = "".join(
        text for text, trained in pieces[: max(i for i, (_, t) in enumerate(pieces) if t)]
    )
    for template in templates:
        feature = template.encode({"messages": messages[:-1]}, add_generation_prompt=True)
        assert template.decode(feature["input_ids"]) == prompt
        assert feature.labels is None


def test_built_in_templates_know_their_stop_tokens(family):
    _, _, (generic, built_in, *_) = family
    assert set(built_in.chat_format.stops) <= set(built_in.stop_tokens)
    # The folder's generation config names the same stops the built-in format does.
    assert set(built_in.chat_format.stops) <= set(generic.stop_tokens)


def test_an_earlier_turn_that_loses_only_its_empty_think_block_is_trained(capsys):
    """Qwen3.5 writes a think block only after the last user message: an earlier turn
    rendered as the latest has an empty one, the whole conversation none. No text of the
    conversation is lost, so every turn is trained as the whole conversation renders it."""
    template = Template("bundled://tiny-qwen3.5")
    feature = template.encode({"messages": two_turns()})
    assert "renders differently" not in capsys.readouterr().err
    replies = template.decode([t for t in feature["labels"] if t != -100])
    assert replies == "Hi there.<|im_end|>\n</think>\n\nIt is 5.<|im_end|>"


def test_a_rewritten_earlier_turn_is_a_history_mismatch():
    """An earlier turn's reasoning is dropped once a later user message follows: text of
    the conversation the labels would lose, refused unless asked for."""
    messages = two_turns()
    messages[1] = {**messages[1], "reasoning_content": "greet back"}
    template = Template("bundled://tiny-qwen3.5")
    with pytest.raises(HistoryMismatchError, match="assistant turn 0") as caught:
        template.encode({"messages": messages})
    assert "greet back" in str(caught.value)
    last = template.encode({"messages": messages}, train_turns="last")
    assert (
        template.decode([t for t in last["labels"] if t != -100])
        == "\n</think>\n\nIt is 5.<|im_end|>"
    )
    warned = Template("bundled://tiny-qwen3.5", history_mismatch="warn").encode(
        {"messages": messages}
    )
    replies = template.decode([t for t in warned["labels"] if t != -100])
    assert replies == "Hi there.<|im_end|>\n</think>\n\nIt is 5.<|im_end|>"


def test_enable_thinking_false_trains_the_reply_after_the_empty_think_block():
    template = Template("bundled://tiny-qwen3.5", enable_thinking=False)
    prompt = template.encode({"messages": thinking_turn()[:1]}, add_generation_prompt=True)
    assert template.decode(prompt["input_ids"]).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    reply = {"role": "assistant", "content": "5"}
    feature = template.encode({"messages": [*thinking_turn()[:1], reply]})
    assert template.decode([t for t in feature["labels"] if t != -100]) == "5<|im_end|>"


@pytest.mark.parametrize(
    ("folder", "written"),
    [
        ("tiny-llama3", "Environment: ipython\n"),
        ("tiny-mistral", "[AVAILABLE_TOOLS] "),
        ("tiny-qwen2.5", "<tools>\n"),
        ("tiny-qwen3.5", "<tools>\n"),
        ("tiny-deepseek-v3", None),
    ],
)
def test_tool_calls_render_and_parse_back(folder, written):
    """A trajectory with tools and a call renders the tool list (where the format has
    one), trains the call, and the generated call parses back to the message's call."""
    template = Template(f"bundled://{folder}")
    row = {"messages": tool_turns(), "tools": [TOOL]}
    text = template.render(row)
    if written is not None:
        assert written in text and "get_weather" in text.split(written, 1)[1]
    feature = template.encode(row, train_turns=[0])
    call_text = template.decode([t for t in feature["labels"] if t != -100])
    assert template.parse_response(call_text)["tool_calls"] == [CALL]
