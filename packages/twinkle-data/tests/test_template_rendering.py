"""Template renders in a sandbox of its own, with transformers' rules answered faster: the
same text as apply_chat_template on every bundled family, and the same refusals."""

import pytest
from jinja2.exceptions import SecurityError, TemplateError, UndefinedError
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

from twinkle.hub import bundled_names
from twinkle.template import EncodeError, Template
from twinkle.template.rendering import render, template_inputs

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi.", "reasoning_content": "greet"},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
        ],
    },
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "Sunny."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def ours(chat_template, messages, **variables):
    return render(
        chat_template,
        *template_inputs(messages, None),
        add_generation_prompt=False,
        variables=variables,
        track_generation=False,
    ).text


@pytest.mark.parametrize("folder", bundled_names("model"))
def test_every_bundled_template_renders_as_apply_chat_template(folder):
    template = Template(f"bundled://{folder}")
    for tools in (None, TOOLS):
        for generation_prompt in (False, True):
            messages = CONVERSATION[:-1] if generation_prompt else CONVERSATION
            row = {"messages": messages, "tools": tools}
            try:
                theirs = template.tokenizer.apply_chat_template(
                    messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
                )
            except TemplateError as err:  # a format without tool turns, say: refused alike
                with pytest.raises(EncodeError, match=str(err)[:40]):
                    template.render(row, add_generation_prompt=generation_prompt)
                continue
            assert template.render(row, add_generation_prompt=generation_prompt) == theirs


def test_it_uses_a_compiled_copy_of_its_own():
    source = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
    assert ours(source, CONVERSATION[:2]) == "system:Be brief.;user:Hello;"
    # transformers' own compiled template keeps its plain sandbox.
    shared = _compile_jinja_template(source).environment
    assert type(shared).__name__ == "ImmutableSandboxedEnvironment"


def outcome(run):
    try:
        return "text", run()
    except (SecurityError, UndefinedError, TemplateError) as err:
        return "refused", type(err)


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages.append(1) }}",  # mutates a list
        "{{ messages[0].update({'role': 'x'}) }}",  # mutates a dict
        "{{ messages[0].content.__class__.__mro__ }}",  # reaches Python internals
        "{{ messages[0].content.startswith.__self__ }}",  # a method's internals: nothing
        "{{ raise_exception.__globals__ }}",  # a function's globals: nothing
        "{{ messages[0].pop('role') }}{{ messages[0].role }}",
    ],
)
def test_the_sandbox_refuses_what_transformers_refuses(source):
    messages = [{"role": "user", "content": "hi"}]
    theirs = outcome(lambda: render_jinja_template([messages], chat_template=source)[0][0])
    # Twice: the second answer comes from the kept (type, name) verdicts.
    for _ in range(2):
        assert outcome(lambda: ours(source, messages)) == theirs
    assert theirs[0] == "refused" or theirs == ("text", "")
    assert messages == [{"role": "user", "content": "hi"}]


def test_dict_keys_and_methods_read_as_before():
    source = (
        "{% set m = messages[0] %}{{ m.role }}|{{ m.items() | list | length }}|"
        "{{ m.get('content') }}|{{ m.missing is defined }}|{{ m['items'] }}"
    )
    message = {"role": "user", "content": "c", "items": "mine"}
    expected = render_jinja_template([[message]], chat_template=source)
    assert ours(source, [message]) == expected[0][0]
    assert expected[0][0] == "user|3|c|False|mine"
