"""Chat templates: a Trajectory in, an InputFeature (input_ids, labels, position_ids) out.

Labels are NOT shifted: ``labels[i]`` is ``input_ids[i]`` where token ``i`` is trained and
-100 elsewhere; the loss predicts ``labels[i]`` from the logits at ``i - 1``, as Hugging
Face models do. Trained tokens are the text each assistant turn writes: its reasoning,
reply and tool calls, and its end-of-turn token (``<|im_end|>``), but neither the
``<|im_start|>assistant\\n`` header before it nor the newline after it (so for ChatML;
the generic ``Template`` labels what the chat template's ``{% generation %}`` blocks
hold). Every assistant turn is trained unless ``train_turns`` picks some (``'last'``,
or indices such as ``[0, -1]``). A generation prompt (``add_generation_prompt=True``,
for RL) has ``labels=None``.

A conversation is rendered once with the tokenizer's own chat template and tokenized once;
labels come from the character spans of the assistant's text. A trained turn that renders
differently in the whole conversation than turn by turn (a template that rewrites
history) is detected and raises :class:`HistoryMismatchError`, or with
``history_mismatch='warn'`` is logged and labelled as the whole conversation renders it. A
rewrite that drops only markup (the empty think block Qwen3 writes on a final reply) loses
no text of the conversation: that turn is labelled as the whole conversation renders it.

Generated text goes back the other way with ``Template.parse_response`` (an assistant
message with ``reasoning_content`` and ``tool_calls``) and ``Template.parse_tool_calls``;
each chat format's tool-call parser is in :mod:`twinkle.template.tool_calls`.

``truncation_strategy='delete'`` makes ``encode`` return None (``batch_encode`` puts None
in the row's place): the caller drops those rows and reports how many it dropped. A row
that cannot be encoded raises :class:`EncodeError`, whose ``index`` is its position in
the batch.
"""

from twinkle.template.base import Template
from twinkle.template.conversation import TrainTurns
from twinkle.template.errors import EncodeError, HistoryMismatchError
from twinkle.template.labels import IGNORE_INDEX
from twinkle.template.qwen import Qwen3_5Template
from twinkle.template.registry import TEMPLATES, build_template
from twinkle.template.tool_calls import TOOL_CALL_FORMATS, ToolCallError
from twinkle.template.truncation import TruncationStrategy

__all__ = [
    "IGNORE_INDEX",
    "TEMPLATES",
    "TOOL_CALL_FORMATS",
    "EncodeError",
    "HistoryMismatchError",
    "Qwen3_5Template",
    "Template",
    "ToolCallError",
    "TrainTurns",
    "TruncationStrategy",
    "build_template",
]
