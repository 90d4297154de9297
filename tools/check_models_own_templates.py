"""Check Twinkle's built-in chat formats against the models' own Jinja chat templates, where a
package on the registry ships them: ``trl`` keeps the templates models ship, byte for byte,
to recognise a tokenizer's model (``trl/chat_templates/<name>.jinja``, its README says which
repository each comes from); ``axolotl`` ships templates of families TRL lacks (its
``mistral_v2v3.jinja``; its ``phi_4.jinja`` is Phi-4-reasoning's, with that model's default
system prompt, so Phi-4 has no template of its own to check against here).

For each (built-in Template, bundled tiny model, model's template) and each conversation:
the built-in's rendering against the model's template's (text), then the built-in's encoding
against the generic ``Template`` on the model's template (each reply found by rendering its
turn), token for token and label for label, every turn trained. Neither package is a
Twinkle dependency; unpack their wheels (no install needed):

    pip download --no-deps -d /tmp/w trl==1.16.0 && unzip -q /tmp/w/trl-*.whl -d /tmp/w/trl
    pip download --no-deps --python-version 3.12 --only-binary=:all: -d /tmp/w axolotl==0.21.0
    unzip -q /tmp/w/axolotl-*.whl -d /tmp/w/axolotl
    .venv/bin/python tools/check_models_own_templates.py /tmp/w/trl/trl/chat_templates \\
        /tmp/w/axolotl/axolotl/utils/chat_templates/templates

Prints one line per (format, conversation): 'same', or where the two differ. Exit status 1
when any differ.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinkle.template import TEMPLATES, HistoryMismatchError, Template

WEATHER = {
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
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
# DeepSeek's template writes the arguments as given: a JSON string.
TEXT_CALL = {
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "single": {
        "messages": [
            {"role": "user", "content": "What is 2 plus 3?"},
            {"role": "assistant", "content": "It is 5."},
        ]
    },
    "system, two turns": {
        "messages": [
            {"role": "system", "content": "You help."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi there."},
            {"role": "user", "content": "Add 2 and 3."},
            {"role": "assistant", "content": "It is 5."},
        ]
    },
    "reasoning": {
        "messages": [
            {"role": "user", "content": "What is 2 plus 3?"},
            {"role": "assistant", "content": "It is 5.", "reasoning_content": "2 + 3 = 5"},
        ]
    },
    "tools": {
        "messages": [
            {"role": "system", "content": "You help."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ],
        "tools": [WEATHER],
    },
}
CONVERSATIONS["tools, string arguments"] = {
    **CONVERSATIONS["tools"],
    "messages": [
        {**m, "tool_calls": [TEXT_CALL]} if m.get("tool_calls") else m
        for m in CONVERSATIONS["tools"]["messages"]
    ],
}


@dataclass(frozen=True)
class ByDesign:
    """A difference from the model's template that the built-in makes on purpose: ``text``
    turns the built-in's rendering of a conversation into what the model's template writes,
    ``prompt`` does the same for a generation prompt; ``why`` says why they differ."""

    why: str
    text: Callable[[str], str] = lambda text: text
    prompt: Callable[[str], str] = lambda text: text


_THINK = re.compile(r"(?<=<｜Assistant｜>)<think>\n.*?\n</think>\n\n", re.DOTALL)
DEEPSEEK_THINKING = ByDesign(
    "the reply after the generation prompt's <think> keeps its think block",
    text=lambda text: _THINK.sub("", text),
    prompt=lambda text: _THINK.sub("", text),
)
DEEPSEEK_CHAT = ByDesign(
    "no <think> opened without thinking",
    prompt=lambda text: text + "<think>\n" if text.endswith("<｜Assistant｜>") else text,
)
# mistral-common's v3 tokenizer puts the system prompt on the last user message; the
# template Mistral ships with v0.3 writes it only when that message ends the conversation,
# so a conversation ending with a reply, as every training row does, loses it.
MISTRAL_V3 = ByDesign(
    "the system prompt on the last user turn, as mistral-common's v3 tokenizer writes it",
    text=lambda text: text.replace("[INST] You help.\n\n", "[INST] "),
)
# (built-in Template, bundled model, the model's template file, where it is, settings,
# conversations the format has: formats without reasoning or tools skip those, and the
# differences it makes on purpose, if any).
ALL = ("single", "system, two turns", "reasoning", "tools")
DEEPSEEK = ("single", "system, two turns", "reasoning", "tools, string arguments")
CHECKS = [
    ("Qwen3Template", "tiny-qwen3", "qwen3.jinja", "trl", {}, ALL),
    ("Qwen3Template", "tiny-qwen3", "qwen3.jinja", "trl", {"enable_thinking": False}, ALL),
    (
        "Qwen2_5Template",
        "tiny-qwen2.5",
        "qwen2_5.jinja",
        "trl",
        {},
        ("single", "system, two turns", "tools"),
    ),
    ("Qwen3_5FormatTemplate", "tiny-qwen3.5", "qwen3_5_think.jinja", "trl", {}, ALL),
    (
        "Llama3Template",
        "tiny-llama3",
        "llama3_1.jinja",
        "trl",
        {},
        ("single", "system, two turns", "tools"),
    ),
    ("Gemma3Template", "tiny-gemma3", "gemma3.jinja", "trl", {}, ("single", "system, two turns")),
    ("DeepSeekV3Template", "tiny-deepseek-v3", "deepseekv3.jinja", "trl", {}, DEEPSEEK),
    (
        "DeepSeekV3Template",
        "tiny-deepseek-v3",
        "deepseekv3.jinja",
        "trl",
        {"enable_thinking": False},
        DEEPSEEK,
    ),
    ("Glm4Template", "tiny-glm4.5", "glm4moe.jinja", "trl", {}, ALL),
    (
        "MistralTemplate",
        "tiny-mistral",
        "mistral_v2v3.jinja",
        "axolotl",
        {},
        ("single", "system, two turns"),
    ),
]
BY_DESIGN = {
    ("DeepSeekV3Template", ()): DEEPSEEK_THINKING,
    ("DeepSeekV3Template", (("enable_thinking", False),)): DEEPSEEK_CHAT,
    ("MistralTemplate", ()): MISTRAL_V3,
}


def first_difference(ours: str, theirs: str) -> str:
    at = len(os.path.commonprefix([ours, theirs]))
    lo = max(0, at - 20)
    return f"from character {at}: ours {ours[lo : at + 40]!r}, theirs {theirs[lo : at + 40]!r}"


def compare(built_in: Template, own: Template, row: dict[str, Any], known: ByDesign | None) -> str:
    known = known or ByDesign("")
    try:
        theirs = own.render(row)
    except Exception as err:  # the model's template refuses the conversation
        return f"the model's template refuses it: {err}"
    rendered = built_in.render(row)
    ours = known.text(rendered)
    if ours != theirs:
        return "rendering differs " + first_difference(ours, theirs)
    last = max(i for i, m in enumerate(row["messages"]) if m["role"] == "assistant")
    prompt = {**row, "messages": row["messages"][:last]}
    generation = built_in.render(prompt, add_generation_prompt=True)
    ours = known.prompt(generation)
    theirs = own.render(prompt, add_generation_prompt=True)
    if ours != theirs:
        return "generation prompt differs " + first_difference(ours, theirs)
    if ours != generation or known.text(rendered) != rendered:
        # The texts differ as intended, so the labels cannot be the same.
        return f"same but by design: {known.why}"
    try:
        expected = own.encode(row)
    except HistoryMismatchError:
        try:
            expected = own.encode(row, train_turns="last")
        except HistoryMismatchError as err:
            # Reasoning with enable_thinking=False: the generation prompt's empty think
            # block is not how the reply opens, so no reply can be cut from the model's
            # template; the texts were compared above.
            return f"same text; the model's template labels no reply: {str(err)[:60]}..."
        got = built_in.encode(row, train_turns="last")
        note = " (the last turn: the format rewrites earlier ones)"
    else:
        got = built_in.encode(row)
        note = ""
    if got["input_ids"].tolist() != expected["input_ids"].tolist():
        return "tokens differ"
    if got["labels"].tolist() != expected["labels"].tolist():
        return "labels differ"
    return "same" + note


def main() -> None:
    folders = {"trl": Path(sys.argv[1]), "axolotl": Path(sys.argv[2])}
    failed = False
    for name, folder, file, source, settings, conversations in CHECKS:
        path = folders[source] / file
        model_id = f"bundled://{folder}"
        built_in = TEMPLATES.get(name)(model_id, **settings)
        own = Template(model_id, chat_template=path.read_text(), **settings)
        known = BY_DESIGN.get((name, tuple(sorted(settings.items()))))
        for title in conversations:
            verdict = compare(built_in, own, CONVERSATIONS[title], known)
            failed |= not verdict.startswith("same")
            flag = ",".join(f"{k}={v}" for k, v in settings.items())
            print(f"{name:22} {source}/{file:24} {flag:22} {title:18} {verdict}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
