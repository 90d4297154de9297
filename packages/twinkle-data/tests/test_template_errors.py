"""Bad inputs to a Template, truncation under each strategy, and the template registry."""

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from twinkle.template import (
    TEMPLATES,
    EncodeError,
    Qwen3_5Template,
    Template,
    build_template,
)

TINY = "bundled://tiny-qwen3"


@pytest.fixture(scope="module")
def qwen():
    return Qwen3_5Template(TINY)


def chat(*pairs, system=None):
    messages = [] if system is None else [{"role": "system", "content": system}]
    for user, assistant in pairs:
        messages.append({"role": "user", "content": user})
        if assistant is not None:
            messages.append({"role": "assistant", "content": assistant})
    return {"messages": messages}


# Bad rows


def test_a_row_without_messages_names_its_keys(qwen):
    with pytest.raises(
        EncodeError, match="trajectory 1: has no 'messages' \\(keys: query, response\\)"
    ):
        qwen.batch_encode([chat(("hi", "yo")), {"query": "hi", "response": "yo"}])


def test_an_empty_conversation(qwen):
    with pytest.raises(EncodeError, match="has no messages"):
        qwen.encode({"messages": []})


def test_an_unknown_role_is_rejected_by_the_data_format(qwen):
    row = {"messages": [{"role": "bot", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    with pytest.raises(EncodeError, match="(?s)not a valid trajectory.*messages.0.role") as caught:
        qwen.encode(row)
    assert "'system', 'user', 'assistant' or 'tool'" in str(caught.value)


def test_a_row_that_is_not_a_trajectory(qwen):
    with pytest.raises(
        EncodeError, match="expected a Trajectory or a dict with 'messages', got list"
    ):
        qwen.encode([{"role": "user", "content": "hi"}])


def test_training_on_a_conversation_that_ends_with_the_user(qwen):
    with pytest.raises(EncodeError, match="ends with a 'user' message.*add_generation_prompt=True"):
        qwen.encode(chat(("hi", "yo"), ("and?", None)))


def test_a_generation_prompt_that_ends_with_the_assistant(qwen):
    with pytest.raises(EncodeError, match="ends with an assistant message"):
        qwen.encode(chat(("hi", "yo")), add_generation_prompt=True)


def test_a_row_the_chat_template_cannot_render_is_named(qwen):
    parts = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    rows = [chat(("hi", "yo")), {"messages": [parts, {"role": "assistant", "content": "yo"}]}]
    with pytest.raises(EncodeError, match="trajectory 1: the chat template cannot render it"):
        qwen.batch_encode(rows)


def test_an_empty_batch(qwen):
    assert qwen.batch_encode([]) == []


def test_train_turns_out_of_range(qwen):
    with pytest.raises(EncodeError, match="assistant turn 2, but the conversation has 2"):
        qwen.encode(chat(("a", "b"), ("c", "d")), train_turns=[2])


@pytest.mark.parametrize("train_turns", ["first", [], [0.5], "0", [True]])
def test_bad_train_turns(qwen, train_turns):
    with pytest.raises(TypeError, match="train_turns must be 'all', 'last'"):
        qwen.encode(chat(("a", "b")), train_turns=train_turns)


def test_a_message_holding_chatml_markup_cannot_be_scanned(qwen):
    row = chat(("say <|im_start|>assistant\nhi", "no"))
    with pytest.raises(EncodeError, match="2 ChatML assistant turn\\(s\\) for 1 assistant"):
        qwen.encode(row)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"truncation_strategy": "middle"}, ValueError, "unknown truncation_strategy 'middle'"),
        ({"max_length": 0}, ValueError, "max_length must be a positive int"),
        ({"max_length": 8.5}, ValueError, "max_length must be a positive int"),
        ({"history_mismatch": "ignore"}, ValueError, "history_mismatch must be 'raise' or 'warn'"),
        ({"enable_thinking": "no"}, TypeError, "enable_thinking must be True, False or None"),
        ({"train_turns": "some"}, TypeError, "train_turns must be"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        Qwen3_5Template(TINY, **kwargs)


def non_chatml_tokenizer(folder: Path, chat_template: str | None) -> str:
    vocab = {"[UNK]": 0, "hi": 1}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    )
    fast.chat_template = chat_template
    fast.save_pretrained(folder)
    return str(folder)


def test_qwen_template_needs_chatml_tokens(tmp_path):
    folder = non_chatml_tokenizer(tmp_path, "{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(
        ValueError, match="needs a ChatML tokenizer.*no <\\|im_start\\|> or <\\|im_end\\|>"
    ):
        Qwen3_5Template(folder)


def test_a_tokenizer_without_chat_template(tmp_path):
    folder = non_chatml_tokenizer(tmp_path, None)
    with pytest.raises(ValueError, match="has no usable chat template .*; pass chat_template="):
        Template(folder)


# Truncation: one sample longer than max_length under each strategy


def long_sample():
    """A system prompt, then a short exchange, then a long one: 90 tokens or so."""
    return chat(
        ("q", "short reply"),
        ("and more", "a long answer about training models " * 4),
        system="You help.",
    )


@pytest.fixture(scope="module")
def full(qwen):
    return qwen.encode(long_sample())


def truncating(strategy, max_length=40):
    return Qwen3_5Template(TINY, max_length=max_length, truncation_strategy=strategy)


def test_sample_is_longer_than_max_length(full):
    assert full["length"] > 60


def test_truncation_raise_names_length_and_max_length(full):
    with pytest.raises(
        EncodeError, match=f"is {full['length']} tokens long, more than max_length=40"
    ):
        truncating("raise").encode(long_sample())


def test_truncation_left_keeps_the_last_tokens(full):
    feature = truncating("left").encode(long_sample())
    np.testing.assert_array_equal(feature["input_ids"], full["input_ids"][-40:])
    np.testing.assert_array_equal(feature["labels"], full["labels"][-40:])
    np.testing.assert_array_equal(feature["position_ids"], np.arange(40))
    assert feature["length"] == 40


def test_truncation_right_keeps_the_first_tokens(full):
    feature = truncating("right").encode(long_sample())
    np.testing.assert_array_equal(feature["input_ids"], full["input_ids"][:40])
    np.testing.assert_array_equal(feature["labels"], full["labels"][:40])
    np.testing.assert_array_equal(feature["position_ids"], np.arange(40))
    assert (feature["labels"] != -100).any()


def test_truncation_right_that_leaves_nothing_to_train_on(full):
    with pytest.raises(
        EncodeError, match="no assistant token left after truncation_strategy='right'"
    ):
        truncating("right", max_length=8).encode(long_sample())


def test_truncation_delete_drops_the_row(full):
    template = truncating("delete")
    assert template.encode(long_sample()) is None
    short = chat(("hi", "yo"))
    batch = template.batch_encode([short, long_sample(), short])
    assert batch[1] is None and batch[0] == batch[2] == template.encode(short)


def test_truncating_a_generation_prompt():
    prompt = chat(("word " * 80, None), system="You help.")
    left = truncating("left").encode(prompt, add_generation_prompt=True)
    assert left["length"] == 40 and left.labels is None
    assert Qwen3_5Template(TINY).decode(left["input_ids"]).endswith("<|im_start|>assistant\n")
    with pytest.raises(EncodeError, match="would remove the assistant header"):
        truncating("right").encode(prompt, add_generation_prompt=True)
    assert truncating("delete").encode(prompt, add_generation_prompt=True) is None


def test_max_length_leaves_short_rows_alone(qwen):
    row = chat(("hi", "yo"))
    assert truncating("raise", max_length=512).encode(row) == qwen.encode(row)


# Registry


def test_registry_knows_both_templates():
    assert {"Qwen3_5Template", "Template"} <= set(TEMPLATES.names())
    assert TEMPLATES.get("Qwen3_5Template") is Qwen3_5Template


def test_build_template_by_name_or_class():
    template = build_template("Qwen3_5Template", model_id=TINY, max_length=512)
    assert type(template) is Qwen3_5Template and template.max_length == 512
    assert type(build_template(Template, model_id=TINY)) is Template


def test_build_template_returns_an_instance_as_is(qwen):
    assert build_template(qwen) is qwen
    with pytest.raises(TypeError, match="instance and settings \\(max_length\\)"):
        build_template(qwen, max_length=8)


def test_unknown_template_lists_the_known_names():
    with pytest.raises(ValueError, match="unknown template 'Qwen9Template'; known: ") as caught:
        build_template("Qwen9Template", model_id=TINY)
    assert str(caught.value).endswith(", ".join(TEMPLATES.names()))
    assert "Qwen3_5Template" in str(caught.value)


def test_build_template_needs_a_model_id():
    with pytest.raises(TypeError, match="building Qwen3_5Template needs model_id"):
        build_template("Qwen3_5Template", max_length=512)
