"""Template: a tokenizer's own chat template applied to trajectories, with labels on the
text the assistant writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from jinja2 import TemplateError
from transformers import AutoTokenizer

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
from twinkle.template.history import (
    common_prefix_length,
    history_difference,
    markup_only_rewrite,
    markup_pattern,
)
from twinkle.template.labels import labels_from_spans
from twinkle.template.rendering import (
    Rendered,
    Span,
    has_generation_markers,
    plain_data,
    render,
)
from twinkle.template.tool_calls import TOOL_CALL_FORMATS, ToolCallFormat, detect_tool_call_format
from twinkle.template.truncation import TRUNCATION_STRATEGIES, TruncationStrategy, truncate
from twinkle.template.turns import locate_reply, nth_reply, reply_span, stop_tokens
from twinkle.utils import get_logger

logger = get_logger(__name__)

HISTORY_MISMATCH_MODES = ("raise", "warn")


@remote_class(execute="first")
class Template:
    """Encode trajectories into InputFeatures with the tokenizer's own chat template.

    In: a :class:`~twinkle.data_format.Trajectory`, or a dict row with ``messages`` (and
    optionally ``tools``, ``user_data``). Out: an :class:`~twinkle.data_format.InputFeature`
    with ``input_ids``, ``labels`` (NOT shifted; -100 outside the trained assistant turns),
    ``position_ids`` (0..n-1), ``length``, and the trajectory's ``messages``, ``tools`` and
    ``user_data`` so a reward can read them.

    The conversation is rendered once and tokenized once; the assistant's text is found in
    the rendering and every token overlapping it is labelled. It is found by the
    template's ``{% generation %}`` blocks where it has them; otherwise (every chat
    template models ship) each trained reply is what rendering the conversation through
    it adds to rendering it up to it with ``add_generation_prompt=True``, up to and
    including the reply's last stop token (:attr:`stop_tokens`). For ChatML templates
    that is the reply with its reasoning and tool calls and its ``<|im_end|>``, not the
    header before it nor the newline after it. Each trained turn that is not the last
    message is checked against the whole rendering to catch a template that rewrites it
    later (``history_mismatch``). Cost: at most two renders per trained turn (one for the
    last message's turn, none with generation blocks and ``train_turns='last'``).

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
            always exactly the tokens of the whole rendering). A rewrite that drops only
            markup, no text of the conversation, is neither: the empty think block Qwen3
            writes on the final reply (and Qwen3.5 on every reply after the last user
            message) is left out of earlier turns, so each earlier reply is trained as
            the whole conversation renders it, as the model sees it in its history at
            inference (``history.markup_only_rewrite``).
        chat_template: a Jinja chat template to use instead of the tokenizer's own, or the
            name of one of the tokenizer's templates.
        tool_call_format: how the model writes tool calls, for :meth:`parse_response`: a
            name in ``TOOL_CALL_FORMATS`` (``'hermes'``, ``'llama3_json'``, ``'mistral'``,
            ...), or None to tell it from the chat template.
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
        tool_call_format: str | None = None,
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
        folder = Path(resolve_model(model_id))
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), **tokenizer_kwargs)
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
        self._generation_blocks = {
            False: has_generation_markers(self.chat_template),
            True: has_generation_markers(self._tools_chat_template),
        }
        self.stop_tokens = stop_tokens(self.tokenizer, folder)
        """The tokens that end a reply (eos and the generation config's): a sampler's stop
        tokens, and where a reply found without generation blocks ends."""
        self.tool_call_format: ToolCallFormat | None = (
            detect_tool_call_format(self._tools_chat_template)
            if tool_call_format is None
            else TOOL_CALL_FORMATS.get(tool_call_format)()
        )
        added = list(self.tokenizer.get_added_vocab())
        self._markup = markup_pattern(added)
        self._longest_markup = max(map(len, added), default=0)
        # The variables apply_chat_template gives a template, so both render the same text.
        variables = dict(self.tokenizer.special_tokens_map)
        if enable_thinking is not None:
            variables["enable_thinking"] = enable_thinking
        self._variables = plain_data(variables)

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
        rendered = [
            self._render(
                conv.messages,
                conv.tools,
                add_generation_prompt,
                not add_generation_prompt and self._reads_blocks(conv.tools),
                index,
            )
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

    @remote_function(dispatch="all", execute="first", collect="first")
    def parse_response(self, text: str) -> dict[str, Any]:
        """Generated text back to an assistant message in the OpenAI / Hugging Face shape,
        ready to append to ``messages``: ``{'role': 'assistant', 'content': ...}`` plus
        ``reasoning_content`` (the text of a ``<think>`` block) and ``tool_calls``
        (``[{'type': 'function', 'function': {'name': ..., 'arguments': {...}}}]``) when
        present. Trailing stop tokens are dropped. A malformed call raises
        :class:`~twinkle.template.tool_calls.ToolCallError` holding its text."""
        for stop in self.stop_tokens:
            text = text.removesuffix(stop)
        message: dict[str, Any] = {"role": "assistant"}
        if "</think>" in text:
            reasoning, text = text.split("</think>", 1)
            message["reasoning_content"] = reasoning.removeprefix("<think>").strip("\n")
            text = text.lstrip("\n")
        calls: list[dict[str, Any]] = []
        if self.tool_call_format is not None:
            text, calls = self.tool_call_format.parse(text)
        message["content"] = text
        if calls:
            message["tool_calls"] = calls
        return message

    @remote_function(dispatch="all", execute="first", collect="first")
    def parse_tool_calls(self, text: str) -> list[dict[str, Any]]:
        """The tool calls in generated text (:meth:`parse_response`'s ``tool_calls``), []
        when it makes none."""
        if self.tool_call_format is None:
            raise ValueError(
                f"the chat template of {self.model_id} writes no tool-call format Twinkle "
                f"knows; pass tool_call_format= one of {', '.join(TOOL_CALL_FORMATS.names())}"
            )
        return self.parse_response(text).get("tool_calls", [])

    # What subclasses change to find the assistant's text another way: tracks_generation
    # (above) and _assistant_spans.

    def _reads_blocks(self, tools: list[dict[str, Any]] | None) -> bool:
        """Whether the replies are read from generation blocks (else by rendering turns)."""
        return self.tracks_generation and self._generation_blocks[tools is not None]

    def _assistant_spans(self, rendered: Rendered, turns: int, index: int) -> list[Span]:
        """One span per assistant message of the rendered conversation, in order: the text
        the assistant writes, including its end-of-turn token. Read here from the
        ``{% generation %}`` blocks, which must be one per assistant message."""
        spans = rendered.generation_spans
        if len(spans) == turns:
            return spans
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
        if self.tracks_generation and not self._reads_blocks(conv.tools):
            return self._rendered_turn_spans(conv, rendered.text, index)
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
            if (
                difference is not None
                and self._markup_only(rendered.text, prefix, prefix_span) != spans[turn]
            ):
                self._report_history_mismatch(index, turn, difference)
        return [spans[turn] for turn in conv.trained]

    def _rendered_turn_spans(self, conv: Conversation, text: str, index: int) -> list[Span]:
        """The trained replies found by rendering each one's conversation up to it (with the
        generation prompt) and through it (the module docstring of ``turns``)."""
        spans: list[Span] = []
        for turn in conv.trained:
            position = conv.assistants[turn]
            prompt = self._render(conv.messages[:position], conv.tools, True, False, index).text
            last = position == len(conv.messages) - 1
            through = (
                text
                if last
                else self._render(
                    conv.messages[: position + 1], conv.tools, False, False, index
                ).text
            )
            span = reply_span(prompt, through, self.stop_tokens)
            if isinstance(span, str):
                # Earlier turns render differently before a new reply than after it, or the
                # generation prompt is not how the template opens a reply.
                self._report_history_mismatch(index, turn, span)
                span = self._reply_after_header(conv, position, prompt, through, turn, index)
            if not last:
                difference = history_difference(text, span, through, span)
                rewritten = None if difference is None else self._markup_only(text, through, span)
                if rewritten is not None:
                    span = rewritten
                elif difference is not None:
                    self._report_history_mismatch(index, turn, difference)
                    after = spans[-1][1] if spans else 0
                    header = self._reply_header(conv, position, prompt, index)
                    counted = nth_reply(text, header, turn, len(conv.assistants), self.stop_tokens)
                    span = counted or locate_reply(text, through[span[0] : span[1]], after, header)
            spans.append(span)
        return spans

    def _reply_after_header(
        self,
        conv: Conversation,
        position: int,
        prompt: str,
        through: str,
        turn: int,
        index: int,
    ) -> Span:
        """The reply's span in ``through`` when ``prompt`` is not its start (the warned
        case): after the last copy of the reply header."""
        header = self._reply_header(conv, position, prompt, index)
        at = through.rfind(header) if header else -1
        if at == -1:
            raise EncodeError(
                index,
                f"assistant turn {turn}: the generation prompt adds {header!r}, which the "
                "conversation through the reply does not contain, so the reply cannot be "
                "found; pass chat_template=... with {% generation %} blocks around each reply",
            )
        return reply_span(through[: at + len(header)], through, self.stop_tokens)

    def _reply_header(self, conv: Conversation, position: int, prompt: str, index: int) -> str:
        """What the generation prompt adds to the conversation before a reply (its
        header): one more render, made only for a warned history mismatch."""
        bare = self._render(conv.messages[:position], conv.tools, False, False, index).text
        return prompt[common_prefix_length(bare, prompt) :]

    def _markup_only(self, text: str, prefix: Rendered | str, prefix_span: Span) -> Span | None:
        """The turn's span in the whole rendering ``text`` when its turn-by-turn rendering
        differs only by markup the template writes (``history.markup_only_rewrite``)."""
        prefix_text = prefix if isinstance(prefix, str) else prefix.text
        return markup_only_rewrite(
            text, prefix_text, prefix_span, self._markup, self._longest_markup
        )

    def _report_history_mismatch(self, index: int, turn: int, difference: str) -> None:
        error = HistoryMismatchError(
            index,
            f"assistant turn {turn} renders differently in the whole conversation than turn "
            f"by turn: {difference}. The chat template rewrites earlier turns (Qwen-style "
            "templates drop the reasoning_content of turns before the last user message; "
            "Mistral's moves the system prompt and tools to the last user turn), so "
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
