"""Copies of the bundled families' chat templates with each assistant reply inside
``{% generation %}`` blocks: the baseline that ``apply_chat_template(...,
return_assistant_tokens_mask=True)`` needs to return a mask at all (the templates models ship
have none).

Each block holds exactly what Template labels: the text the generation prompt leaves the
model to write, through its stop token (not the newline some formats write after it). The
benchmark rows have no tools, so only plain replies are marked; a copy is checked by
comparing its mask with Template's labels token for token on every row.
"""

from __future__ import annotations

EDITS: dict[str, list[tuple[str, str]]] = {
    "tiny-qwen2.5": [
        (
            "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}",
            "{%- if message.content %}{{- '\\n' }}{%- endif %}\n{%- generation %}\n"
            "{%- if message.content %}{{- message.content }}{%- endif %}",
        ),
        (
            "{{- '<|im_end|>\\n' }}\n{%- elif message.role == 'tool' %}",
            "{{- '<|im_end|>' }}\n{%- endgeneration %}\n{{- '\\n' }}\n"
            "{%- elif message.role == 'tool' %}",
        ),
    ],
    "tiny-qwen3.5": [
        (
            "{%- if loop.index0 > ns.last_query %}{{- '<think>\\n' + (reasoning | trim) + "
            "'\\n</think>\\n\\n' }}{%- endif %}",
            "{%- if loop.index0 > ns.last_query %}{{- '<think>\\n' }}{%- endif %}\n"
            "{%- generation %}\n{%- if loop.index0 > ns.last_query %}"
            "{{- (reasoning | trim) + '\\n</think>\\n\\n' }}{%- endif %}",
        ),
        (
            "{{- '<|im_end|>\\n' }}\n{%- elif role == 'tool' %}",
            "{{- '<|im_end|>' }}\n{%- endgeneration %}\n{{- '\\n' }}\n{%- elif role == 'tool' %}",
        ),
    ],
    "tiny-llama3": [
        (
            "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + "
            "(message.content | trim) + '<|eot_id|>' }}",
            "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}\n"
            "{%- if message.role == 'assistant' %}{%- generation %}"
            "{{- (message.content | trim) + '<|eot_id|>' }}{%- endgeneration %}\n"
            "{%- else %}{{- (message.content | trim) + '<|eot_id|>' }}{%- endif %}",
        ),
    ],
    "tiny-mistral": [
        (
            "{{- ' ' + message.content.rstrip(' ') + eos_token }}",
            "{%- generation %}{{- ' ' + message.content.rstrip(' ') + eos_token }}"
            "{%- endgeneration %}",
        ),
    ],
    "tiny-gemma3": [
        (
            "{{- '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + "
            "(message.content | trim) + '<end_of_turn>\\n' }}",
            "{{- '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') }}\n"
            "{%- if role == 'model' %}{%- generation %}"
            "{{- (message.content | trim) + '<end_of_turn>' }}{%- endgeneration %}\n"
            "{%- else %}{{- (message.content | trim) + '<end_of_turn>' }}{%- endif %}\n"
            "{{- '\\n' }}",
        ),
    ],
    "tiny-deepseek-v3": [
        (
            "{%- if thinking and not after_tool and loop.index0 > ns.last_user %}\n"
            "{{- '<think>\\n' + ((reasoning or '') | trim) + '\\n</think>\\n\\n' + "
            "content.lstrip('\\n') }}\n{%- else %}\n{{- content }}\n{%- endif %}",
            "{%- set think = thinking and not after_tool and loop.index0 > ns.last_user %}\n"
            "{%- if think %}{{- '<think>\\n' }}{%- endif %}\n{%- generation %}\n"
            "{%- if think %}{{- ((reasoning or '') | trim) + '\\n</think>\\n\\n' + "
            "content.lstrip('\\n') }}{%- else %}{{- content }}{%- endif %}",
        ),
        (
            "{{- '<｜end▁of▁sentence｜>' }}",
            "{{- '<｜end▁of▁sentence｜>' }}\n{%- endgeneration %}",
        ),
    ],
    "tiny-glm4.5": [
        (
            "{{- '<|assistant|>' }}\n{%- if loop.index0 > ns.last_user",
            "{{- '<|assistant|>' }}\n{%- generation %}\n{%- if loop.index0 > ns.last_user",
        ),
        (
            "{%- endfor %}\n{%- elif message.role == 'tool' %}",
            "{%- endfor %}\n{%- endgeneration %}\n{%- elif message.role == 'tool' %}",
        ),
    ],
    "tiny-phi4": [
        (
            "{{- '<|im_start|>' + message.role + '<|im_sep|>' + message.content + '<|im_end|>' }}",
            "{{- '<|im_start|>' + message.role + '<|im_sep|>' }}\n"
            "{%- if message.role == 'assistant' %}{%- generation %}"
            "{{- message.content + '<|im_end|>' }}{%- endgeneration %}\n"
            "{%- else %}{{- message.content + '<|im_end|>' }}{%- endif %}",
        ),
    ],
}
"""Per family, the (text, replacement) edits that mark its replies; the Qwen3 template
bundled with tiny-qwen3 has its blocks already."""


def with_generation_blocks(family: str, chat_template: str) -> str:
    """``chat_template`` (the family's bundled one) with its replies marked."""
    if "{%- generation %}" in chat_template:
        return chat_template
    marked = chat_template
    for text, replacement in EDITS[family]:
        if marked.count(text) != 1:
            raise ValueError(
                f"{family}'s chat template has changed: the edit for {text!r} must match "
                f"once, it matches {marked.count(text)} times; update benchmarks/"
                "generation_blocks.py"
            )
        marked = marked.replace(text, replacement)
    return marked
