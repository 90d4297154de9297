"""Cross-check Twinkle's chat formats against an independent implementation: the renderers of
``tinker-cookbook`` (not a Twinkle dependency), token for token on the bundled tiny
tokenizers: the sequence and which tokens are trained (the last assistant message).

    uv pip install --no-deps --target /tmp/tc tinker-cookbook==0.5.8 tml-renderers==0.2.1
    PYTHONPATH=/tmp/tc .venv/bin/python tools/crosscheck_chat_formats.py

Prints one line per (format, conversation): 'same' or where the two differ.
"""

from __future__ import annotations

from tinker_cookbook.renderers import TrainOnWhat, get_renderer

from twinkle.template import Template

PAIRS = [
    ("qwen3", "tiny-qwen3"),
    ("qwen3_disable_thinking", "tiny-qwen3"),
    ("llama3", "tiny-llama3"),
]
PAIRS += [("deepseekv3", "tiny-deepseek-v3")]
CONVERSATIONS = {
    "single": [
        {"role": "user", "content": "What is 2 plus 3?"},
        {"role": "assistant", "content": "It is 5."},
    ],
    "system, two turns": [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there."},
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": "It is 5."},
    ],
}


def compare(renderer_name: str, folder: str, messages: list[dict]) -> str:
    kwargs = {"enable_thinking": False} if renderer_name == "qwen3_disable_thinking" else {}
    template = Template(f"bundled://{folder}", **kwargs)
    renderer = get_renderer(renderer_name, template.tokenizer)
    model_input, weights = renderer.build_supervised_example(
        messages, train_on_what=TrainOnWhat.LAST_ASSISTANT_MESSAGE
    )
    theirs = model_input.to_ints()
    feature = template.encode({"messages": messages}, train_turns="last")
    ours = feature["input_ids"].tolist()
    # The cookbook ends a supervised example at the last stop token; a template's newline
    # after it (ChatML's) is the template's, untrained: compare the rest.
    tail = template.decode(ours[len(theirs) :]) if ours[: len(theirs)] == theirs else None
    note = f" (the template's trailing {tail!r} after it)" if tail and not tail.strip() else ""
    if note:
        ours = ours[: len(theirs)]
    if theirs != ours:
        at = next(
            (i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b),
            min(map(len, (theirs, ours))),
        )
        return (
            f"tokens differ from {at}: cookbook {template.decode(theirs[at : at + 12])!r}, "
            f"twinkle {template.decode(ours[at : at + 12])!r}"
        )
    trained_theirs = [i for i, w in enumerate(weights.tolist()) if w > 0]
    trained_ours = [i for i, label in enumerate(feature["labels"].tolist()) if label != -100]
    if trained_theirs != trained_ours:
        return f"trained tokens differ: cookbook {trained_theirs}, twinkle {trained_ours}"
    return "same" + note


def main() -> None:
    for renderer_name, folder in PAIRS:
        for title, messages in CONVERSATIONS.items():
            verdict = compare(renderer_name, folder, messages)
            print(f"{renderer_name:24} {folder:18} {title:18} {verdict}")


if __name__ == "__main__":
    main()
