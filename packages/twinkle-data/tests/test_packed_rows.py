"""pack_padded: a padded batch's rows as one packed row and back, on both padding sides, and
the batches it refuses because packing them would change the result."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from twinkle.data_format import InputFeature
from twinkle.processor import IGNORE_INDEX, InputProcessor, pack_padded

X = IGNORE_INDEX


def features() -> list[InputFeature]:
    return [
        InputFeature(input_ids=[11, 12, 13], labels=[11, 12, 13]),
        InputFeature(input_ids=[21], labels=[X]),
        InputFeature(input_ids=[31, 32], labels=[X, 32]),
    ]


@pytest.mark.parametrize("side", ["right", "left"])
def test_packs_the_real_tokens_in_row_order_with_restarting_positions(side):
    batch = InputProcessor(padding_side=side, pad_token_id=7)(features())
    packed = pack_padded(batch)
    assert packed.input_ids.tolist() == [[11, 12, 13, 21, 31, 32]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 0, 1]]
    # Each sequence's first token is never a target, so no row predicts from another.
    assert packed.labels.tolist() == [[X, 12, 13, X, X, 32]]
    assert packed.lengths.tolist() == [3, 1, 2] and packed.num_tokens == 6
    assert set(packed.model_inputs()) == {"input_ids", "position_ids"}


def test_the_varlen_batch_is_the_padding_free_processors_row():
    """What a strategy that splits rows over ranks reads: the same keys and values as
    InputProcessor(padding_free=True) gives for these features, sequence starts unlabelled."""
    packed = pack_padded(InputProcessor(padding_side="left", pad_token_id=7)(features()))
    varlen = packed.varlen_batch()
    reference = InputProcessor(padding_free=True)(features())
    reference.pop("num_pad_tokens")
    assert varlen.keys() == reference.keys()
    for key in ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(varlen[key], reference[key]), key
        assert varlen[key].dtype == reference[key].dtype, key
    assert varlen["max_length_q"] == varlen["max_length_k"] == reference["max_length_q"] == 3
    assert varlen["labels"].tolist() == [[X, 12, 13, X, X, 32]]


@pytest.mark.parametrize("side", ["right", "left"])
def test_to_rows_puts_every_value_back_in_its_padded_place_and_keeps_gradients(side):
    batch = InputProcessor(padding_side=side, pad_token_id=7)(features())
    packed = pack_padded(batch)
    values = packed.input_ids.double().requires_grad_()
    rows = packed.to_rows(values.unsqueeze(-1).expand(1, -1, 2))
    assert rows.shape == (3, 3, 2)
    mask = batch["attention_mask"].bool()
    assert torch.equal(rows[..., 0][mask].long(), batch["input_ids"][mask])
    assert not rows[~mask].any()
    rows.sum().backward()
    assert values.grad.tolist() == [[2.0] * 6]


def test_a_packed_forward_gives_each_row_its_padded_logits():
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config).eval()
    feats = [{"input_ids": [5, 9, 17, 33, 2]}, {"input_ids": [8, 4]}, {"input_ids": [40, 41]}]
    batch = InputProcessor()(feats)
    packed = pack_padded(batch)
    with torch.no_grad():
        padded = model(
            batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            use_cache=False,
        ).logits
        rows = packed.to_rows(model(**packed.model_inputs(), use_cache=False).logits)
    mask = batch["attention_mask"].bool()
    torch.testing.assert_close(rows[mask], padded[mask], atol=1e-5, rtol=1e-5)


def test_refuses_batches_whose_packed_form_would_differ():
    batch = InputProcessor()(features())
    assert pack_padded({"input_ids": batch["input_ids"]}) is None  # no padding mask
    custom = dict(batch, position_ids=batch["position_ids"] + 1)
    assert pack_padded(custom) is None  # positions that do not start at 0
    left = InputProcessor(padding_side="left")(features())
    labels = left["labels"].clone()
    labels[2, 1] = 31  # the first token of a left-padded row, predicted from its padding
    assert pack_padded(dict(left, labels=labels)) is None
    right_labels = batch["labels"].clone()
    right_labels[2, 0] = 31  # column 0 is never predicted, padded or packed
    assert pack_padded(dict(batch, labels=right_labels)).labels[0, 4] == X
