"""Template: a tokenizer's own chat template applied to trajectories, with labels on the
text the assistant writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from jinja2 import TemplateError
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from twinkle.data_format import InputFeature, Trajectory
from twinkle.hub import resolve_model
from twinkle.infra import remote_class, remote_function
from twinkle.template.conversation import (
    Conversation,
    TrainTurns,
    check_train_turns,
    prepare,
    to_trajectory,
)
from twinkle.template.errors import EncodeError, HistoryMismatchError
from twinkle.template.history import history_difference
from twinkle.template.labels import labels_from_spans
from twinkle.template.rendering import Rendered, Span, has_generation_markers, render
from twinkle.template.truncation import TRUNCATION_STRATEGIES, TruncationStrategy, truncate
from twinkle.utils import get_logger

logger = get_logger(__name__)

HISTORY_MISMATCH_MODES = ("raise", "warn")


def load_tokenizer(model_id: str, **tokenizer_kwargs: Any) -> PreTrainedTokenizerBase:
    """The tokenizer of ``model_id``, any id ``twinkle.hub.resolve_model`` takes (a local
    folder, ``bundled://``, ``ms://``, ``hf://``, ``org/name``)."""
    return AutoTokenizer.from_pretrained(str(resolve_model(model_id)), **tokenizer_kwargs)


@remote_class(execute="first")
class Template:
    """Encode trajectories into InputFeatures with the tokenizer's own chat template.

    In: a :class:`~twinkle.data_format.Trajectory`, or a dict row with ``messages`` (and
    optionally ``tools``, ``user_data``). Out: an :class:`~twinkle.data_format.InputFeature`
    with ``input_ids``, ``labels`` (NOT shifted; -100 outside the trained assistant turns),
    ``position_ids`` (0..n-1), ``length``, and the trajectory's ``messages``, ``tools`` and
    ``user_data`` so a reward can read them.

    The conversation is rendered once and tokenized once; the assistant's text is found in
    the rendering by the template's ``{% generation %}`` blocks (this class) or by the chat
    format (subclasses such as :class:`Qwen3_5Template`), and every token overlapping it
    is labelled. For ChatML templates (the bundled one, Qwen's) that is the reply with its
    reasoning and tool calls and its ``<|im_end|>``, not the header before it nor the
    newline after it. Each trained turn that is not the last message is also rendered as
    the end of its own conversation to check the template does not rewrite it later
    (``history_mismatch``): one extra render per such turn, none with ``train_turns='last'``.

    Args:
        model_id: a hub id (``ms://``, ``hf://``, ``bundled://``, ``org/name``) or a local
            folder holding the tokenizer.
        max_length: the most tokens a sequence may have; None for no limit.
        truncation_strategy: what to do with a longer sequence: ``'raise'`` an error,
            keep the last tokens (``'left'``) or the first (``'right'``), or ``'delete'`` the
            row (``encode`` returns None; ``batch_encode`` puts None in its place, for the
            caller to drop and count).
        default_system: a system prompt put first in conversations that have none.
        enable_thinking: passed to the chat template as ``enable_thinking``; None leaves
            the template's default (thinking on, for the Qwen templates).
        train_turns: the assistant turns to label by default: ``'all'``, ``'last'``, or a
            list of indices among the assistant turns (0 the first, -1 the last).
        history_mismatch: what happens when a trained turn renders differently in the
            whole conversation than in the conversation cut right after it (a template
            that rewrites history, such as dropping the reasoning of earlier turns):
            ``'raise'`` a :class:`HistoryMismatchError`, or ``'warn'`` and label the turn
            as the whole conversation renders it (the tokens the model is trained on are
            always exactly the tokens of the whole rendering).
        chat_template: a Jinja chat template to use instead of the tokenizer's own, or the
            name of one of the tokenizer's templates.
        **tokenizer_kwargs: passed to ``AutoTokenizer.from_pretrained``.
    """

    tracks_generation = True
    """Whether :meth:`_assistant_spans` reads the spans of ``{% generation %}`` blocks
    (rendering then records them)."""

    def __init__(
        self,
        model_id: str,
        max_length: int | None = None,
        truncation_strategy: TruncationStrategy = "raise",
        default_system: str | None = None,
        enable_thinking: bool | None = None,
        train_turns: TrainTurns = "all",
        history_mismatch: Literal["raise", "warn"] = "raise",
        chat_template: str | None = None,
        **tokenizer_kwargs: Any,
    ) -> None:
        if max_length is not None and (
            not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1
        ):
            raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")
        if truncation_strategy not in TRUNCATION_STRATEGIES:
            raise ValueError(
                f"unknown truncation_strategy {truncation_strategy!r}; use one of "
                f"{', '.join(map(repr, TRUNCATION_STRATEGIES))}"
            )
        if history_mismatch not in HISTORY_MISMATCH_MODES:
            raise ValueError(
                f"history_mismatch must be 'raise' or 'warn', got {history_mismatch!r}"
            )
        if enable_thinking is not None and not isinstance(enable_thinking, bool):
            raise TypeError(f"enable_thinking must be True, False or None, got {enable_thinking!r}")
        self.model_id = model_id
        self.max_length = max_length
        self.truncation_strategy = truncation_strategy
        self.default_system = default_system
        self.enable_thinking = enable_thinking
        self.train_turns = check_train_turns(train_turns)
        self.history_mismatch = history_mismatch
        self.tokenizer = load_tokenizer(model_id, **tokenizer_kwargs)
        if not self.tokenizer.is_fast:
            raise ValueError(
                f"Template needs a fast tokenizer (it maps characters to tokens with offsets), "
                f"but {model_id} loads {type(self.tokenizer).__name__}"
            )
        # Picked as apply_chat_template picks: a tokenizer may ship several, one for tools.
        try:
            self.chat_template = self.tokenizer.get_chat_template(chat_template)
            self._tools_chat_template = self.tokenizer.get_chat_template(chat_template, tools=[])
        except ValueError as err:
            raise ValueError(
                f"the tokenizer of {model_id} has no usable chat template ({err}); pass "
                "chat_template=... (a Jinja template or the name of one the tokenizer has)"
            ) from err
        # The variables apply_chat_template gives a template, so both render the same text.
        self._variables = dict(self.tokenizer.special_tokens_map)
        if enable_thinking is not None:
            self._variables["enable_thinking"] = enable_thinking

    @remote_function(dispatch="all", execute="first", collect="first")
    def encode(
        self,
        trajectory: Trajectory | Mapping[str, Any],
        add_generation_prompt: bool = False,
        *,
        train_turns: TrainTurns | None = None,
    ) -> InputFeature | None:
        """One trajectory as an InputFeature (see the class docstring); None when
        ``truncation_strategy='delete'`` dropped it.

        ``add_generation_prompt=True`` encodes an RL prompt: the conversation must not end
        with an assistant turn, the sequence ends with the assistant header the model
        continues from, and ``labels`` is None (there is nothing to train on).
        ``train_turns`` overrides the template's default for this call.
        """
        return self.batch_encode([trajectory], add_generation_prompt, train_turns=train_turns)[0]

    @remote_function(dispatch="all", execute="first", collect="first")
    def batch_encode(
        self,
        trajectories: Sequence[Trajectory | Mapping[str, Any]],
        add_generation_prompt: bool = False,
        *,
        train_turns: TrainTurns | None = None,
    ) -> list[InputFeature | None]:
        """:meth:`encode` for many trajectories with one tokenizer call; the result has one
        entry per trajectory, None where ``truncation_strategy='delete'`` dropped it. A bad
        trajectory raises :class:`EncodeError` whose ``index`` is its position here."""
        turns = self.train_turns if train_turns is None else check_train_turns(train_turns)
        conversations = [
            prepare(
                to_trajectory(item, index),
                index,
                add_generation_prompt=add_generation_prompt,
                train_turns=turns,
                default_system=self.default_system,
            )
            for index, item in enumerate(trajectories)
        ]
        track = not add_generation_prompt and self.tracks_generation
        rendered = [
            self._render(conv.messages, conv.tools, add_generation_prompt, track, index)
            for index, conv in enumerate(conversations)
        ]
        if not rendered:
            return []
        # One call for the batch; labels come from the encodings' character lookups, so no
        # per-token offset lists are built.
        encoded = self.tokenizer(
            [r.text for r in rendered], add_special_tokens=False, return_attention_mask=False
        )
        features = []
        for index, (conv, rendition) in enumerate(zip(conversations, rendered, strict=True)):
            input_ids = np.asarray(encoded["input_ids"][index], dtype=np.int64)
            labels = None
            if not add_generation_prompt:
                spans = self._trained_spans(conv, rendition, index)
                labels = labels_from_spans(input_ids, encoded.encodings[index], spans)
            kept = truncate(
                input_ids,
                labels,
                max_length=self.max_length,
                strategy=self.truncation_strategy,
                index=index,
            )
            features.append(None if kept is None else self._feature(conv.trajectory, *kept))
        return features

    @remote_function(dispatch="all", execute="first", collect="first")
    def render(
        self, trajectory: Trajectory | Mapping[str, Any], add_generation_prompt: bool = False
    ) -> str:
        """The text :meth:`encode` tokenizes: what ``tokenizer.apply_chat_template(...,
        tokenize=False)`` gives for the same messages, tools and template variables."""
        conv = prepare(
            to_trajectory(trajectory, 0),
            0,
            add_generation_prompt=add_generation_prompt,
            train_turns="all",
            default_system=self.default_system,
        )
        return self._render(conv.messages, conv.tools, add_generation_prompt, False, 0).text

    @remote_function(dispatch="all", execute="first", collect="first")
    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str:
        """Token ids (a list, array or tensor) back to text. With the default
        ``skip_special_tokens=False``, decoding ``encode(...)['input_ids']`` gives back the
        rendered conversation exactly; True drops ``<|im_start|>``/``<|im_end|>`` and the like."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    # What subclasses change to find the assistant's text another way: tracks_generation
    # (above) and _assistant_spans.

    def _assistant_spans(self, rendered: Rendered, turns: int, index: int) -> list[Span]:
        """One span per assistant message of the rendered conversation, in order: the text
        the assistant writes, including its end-of-turn token. Read here from the
        ``{% generation %}`` blocks, which must be one per assistant message."""
        spans = rendered.generation_spans
        if len(spans) == turns:
            return spans
        if not has_generation_markers(self.chat_template):
            raise ValueError(
                f"the chat template of {self.model_id} has no {{% generation %}} blocks, so "
                "Template cannot tell the assistant's text from the rest; use a template that "
                "knows the chat format (such as Qwen3_5Template for ChatML models) or pass "
                "chat_template=... with generation blocks around each assistant reply"
            )
        raise EncodeError(
            index,
            f"the chat template wrote {len(spans)} generation block(s) for {turns} assistant "
            "message(s); Template needs exactly one {% generation %} block per assistant message",
        )

    def _render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        track: bool,
        index: int,
    ) -> Rendered:
        try:
            return render(
                self.chat_template if tools is None else self._tools_chat_template,
                messages,
                tools,
                add_generation_prompt=add_generation_prompt,
                variables=self._variables,
                track_generation=track,
            )
        except (TemplateError, TypeError, ValueError) as err:
            # Templates reject what they cannot render (roles out of order, content parts
            # where text is expected) with these; name the row.
            raise EncodeError(index, f"the chat template cannot render it: {err}") from err

    def _trained_spans(self, conv: Conversation, rendered: Rendered, index: int) -> list[Span]:
        """The spans of the trained turns, each checked against its turn-by-turn rendering."""
        spans = self._assistant_spans(rendered, len(conv.assistants), index)
        for turn in conv.trained:
            position = conv.assistants[turn]
            if position == len(conv.messages) - 1:
                continue  # the conversation cut after its last message is the conversation
            prefix = self._render(
                conv.messages[: position + 1], conv.tools, False, self.tracks_generation, index
            )
            prefix_span = self._assistant_spans(prefix, turn + 1, index)[-1]
            difference = history_difference(rendered.text, spans[turn], prefix.text, prefix_span)
            if difference is not None:
                self._report_history_mismatch(index, turn, difference)
        return [spans[turn] for turn in conv.trained]

    def _report_history_mismatch(self, index: int, turn: int, difference: str) -> None:
        error = HistoryMismatchError(
            index,
            f"assistant turn {turn} renders differently in the whole conversation than turn "
            f"by turn: {difference}. The chat template rewrites earlier turns (Qwen-style "
            "templates drop the reasoning_content of turns before the last user message), so "
            "the labels of that turn would not be the text the model writes when the turn is "
            "its latest. Train only the last turn (train_turns='last'), split the "
            "conversation into one row per turn, or pass history_mismatch='warn' to label the "
            "turn as the whole conversation renders it",
        )
        if self.history_mismatch == "raise":
            raise error
        logger.warning(str(error))

    def _feature(
        self, trajectory: Trajectory, input_ids: np.ndarray, labels: np.ndarray | None
    ) -> InputFeature:
        return InputFeature(
            input_ids=input_ids,
            labels=labels,
            position_ids=np.arange(len(input_ids), dtype=np.int64),
            length=len(input_ids),
            messages=trajectory.messages,
            tools=trajectory.tools,
            user_data=trajectory.user_data,
        )
