"""InputProcessor: padding on both sides token by token, padding-free packing with the varlen
kwargs transformers reads, the inverse, packed features, and bad input."""

from __future__ import annotations

import pytest
import torch
from transformers.modeling_flash_attention_utils import prepare_fa_kwargs_from_position_ids

from twinkle.data_format import InputFeature
from twinkle.hub import resolve_model
from twinkle.processor import IGNORE_INDEX, INPUT_PROCESSORS, InputProcessor

X = IGNORE_INDEX
PAD = 7


def features() -> list[InputFeature]:
    """Three sequences of 3, 1 and 2 tokens; labels cover the answer tokens."""
    return [
        InputFeature(input_ids=[11, 12, 13], labels=[11, 12, 13]),
        InputFeature(input_ids=[21], labels=[X]),
        InputFeature(input_ids=[31, 32], labels=[X, 32]),
    ]


def packed_feature() -> InputFeature:
    """What PackingDataset yields: two sequences (2 and 3 tokens) in one row."""
    return InputFeature(
        input_ids=[41, 42, 51, 52, 53],
        labels=[X, 42, X, 52, 53],
        position_ids=[0, 1, 0, 1, 2],
    )


# ---- padded -------------------------------------------------------------------------------


def test_right_padding_token_by_token():
    feats = features()
    batch = InputProcessor(padding_side="right", pad_token_id=PAD)(feats)
    assert feats[0].labels.tolist() == [11, 12, 13], "the features themselves stay unchanged"
    assert set(batch) == {"input_ids", "labels", "attention_mask", "position_ids"}
    assert batch["input_ids"].tolist() == [[11, 12, 13], [21, PAD, PAD], [31, 32, PAD]]
    # The first token of every sequence is never a target.
    assert batch["labels"].tolist() == [[X, 12, 13], [X, X, X], [X, 32, X]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0], [0, 1, 0]]
    assert all(value.dtype == torch.long for value in batch.values())


def test_left_padding_token_by_token():
    batch = InputProcessor(padding_side="left", pad_token_id=PAD)(features())
    assert batch["input_ids"].tolist() == [[11, 12, 13], [PAD, PAD, 21], [PAD, 31, 32]]
    assert batch["labels"].tolist() == [[X, 12, 13], [X, X, X], [X, X, 32]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 1]]


def test_left_padding_masks_a_first_token_label_that_would_be_predicted_from_padding():
    batch = InputProcessor(padding_side="left")(
        [{"input_ids": [5, 6], "labels": [5, 6]}, *features()]
    )
    assert batch["labels"][0].tolist() == [X, X, 6]


def test_pad_to_multiple_of_rounds_the_padded_length_up():
    batch = InputProcessor(pad_to_multiple_of=4, pad_token_id=PAD)(features())
    assert batch["input_ids"].shape == (3, 4)
    assert batch["input_ids"][0].tolist() == [11, 12, 13, PAD]
    assert batch["attention_mask"][0].tolist() == [1, 1, 1, 0]


def test_prompts_without_labels_give_no_labels():
    batch = InputProcessor()([{"input_ids": [1, 2]}, {"input_ids": [3]}])
    assert "labels" not in batch
    assert batch["input_ids"].tolist() == [[1, 2], [3, 0]]


def test_tensors_and_dicts_are_accepted_like_features():
    batch = InputProcessor()(
        [
            {"input_ids": torch.tensor([1, 2]), "labels": torch.tensor([1, 2])},
            InputFeature(input_ids=[3], labels=[3], attention_mask=[1]),
        ]
    )
    assert batch["input_ids"].tolist() == [[1, 2], [3, 0]]
    assert batch["labels"].tolist() == [[X, 2], [X, X]]


# ---- padding-free -------------------------------------------------------------------------


def test_padding_free_concatenates_into_one_row_with_varlen_kwargs():
    batch = InputProcessor(padding_free=True)(features())
    assert batch["input_ids"].tolist() == [[11, 12, 13, 21, 31, 32]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 0, 1]]
    assert batch["labels"].tolist() == [[X, 12, 13, X, X, 32]]
    assert "attention_mask" not in batch
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert batch[key].dtype == torch.int32
        assert batch[key].tolist() == [0, 3, 4, 6]
    assert batch["max_length_q"] == batch["max_length_k"] == 3
    assert isinstance(batch["max_length_q"], int)
    assert batch["num_pad_tokens"] == 0


@pytest.mark.parametrize("pad_to_multiple_of", [None, 4, 8])
def test_padding_free_kwargs_match_what_transformers_derives_from_positions(pad_to_multiple_of):
    batch = InputProcessor(padding_free=True, pad_to_multiple_of=pad_to_multiple_of)(
        [*features(), packed_feature()]
    )
    (cu_q, cu_k), (max_q, max_k) = prepare_fa_kwargs_from_position_ids(batch["position_ids"])
    assert torch.equal(batch["cu_seq_lens_q"], cu_q)
    assert torch.equal(batch["cu_seq_lens_k"], cu_k)
    assert batch["max_length_q"] == int(max_q) and batch["max_length_k"] == int(max_k)


def test_packed_features_keep_their_inner_boundaries():
    batch = InputProcessor(padding_free=True)([packed_feature(), features()[2]])
    assert batch["input_ids"].tolist() == [[41, 42, 51, 52, 53, 31, 32]]
    assert batch["position_ids"].tolist() == [[0, 1, 0, 1, 2, 0, 1]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 2, 5, 7]
    assert batch["labels"].tolist() == [[X, 42, X, 52, 53, X, 32]]
    assert batch["max_length_q"] == 3


def test_padding_free_pad_to_multiple_of_adds_one_padding_sequence():
    batch = InputProcessor(padding_free=True, pad_to_multiple_of=4, pad_token_id=PAD)(features())
    assert batch["input_ids"].tolist() == [[11, 12, 13, 21, 31, 32, PAD, PAD]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 0, 1, 0, 1]]
    assert batch["labels"].tolist() == [[X, 12, 13, X, X, 32, X, X]]
    assert batch["cu_seq_lens_q"].tolist() == [0, 3, 4, 6, 8]
    assert batch["num_pad_tokens"] == 2


# ---- unpack -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "processor",
    [
        InputProcessor(padding_side="right"),
        InputProcessor(padding_side="left", pad_to_multiple_of=8),
        InputProcessor(padding_free=True),
        InputProcessor(padding_free=True, pad_to_multiple_of=8),
    ],
    ids=["right", "left-multiple", "padding-free", "padding-free-multiple"],
)
def test_unpack_returns_each_sequence_without_padding(processor):
    batch = processor(features())
    tokens = processor.unpack(batch["input_ids"], batch)
    assert [t.tolist() for t in tokens] == [[11, 12, 13], [21], [31, 32]]
    # Per-token outputs with trailing dimensions (logits) split the same way.
    logits = batch["input_ids"].unsqueeze(-1).float().expand(-1, -1, 5)
    pieces = processor.unpack(logits, batch)
    assert [p.shape for p in pieces] == [(3, 5), (1, 5), (2, 5)]
    assert pieces[2][:, 0].tolist() == [31.0, 32.0]


def test_unpack_splits_a_packed_feature_into_its_sequences():
    processor = InputProcessor(padding_free=True)
    batch = processor([features()[1], packed_feature()])
    pieces = processor.unpack(batch["input_ids"], batch)
    assert [p.tolist() for p in pieces] == [[21], [41, 42], [51, 52, 53]]


def test_unpack_rejects_outputs_of_another_shape():
    processor = InputProcessor()
    batch = processor(features())
    with pytest.raises(ValueError, match=r"shape \(3, 2\) but the batch's input_ids"):
        processor.unpack(torch.zeros(3, 2), batch)
    with pytest.raises(ValueError, match="the dict this InputProcessor's __call__ returned"):
        processor.unpack(torch.zeros(3, 3), {"input_ids": batch["input_ids"]})


# ---- against a model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(resolve_model("bundled://tiny-qwen3"))
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def test_padded_and_padding_free_batches_give_each_sequence_its_own_logits(tiny_model):
    feats = [
        InputFeature(input_ids=[5, 9, 17, 33, 2], labels=[5, 9, 17, 33, 2]),
        InputFeature(input_ids=[8, 4], labels=[8, 4]),
        InputFeature(input_ids=[40, 41, 42], labels=[40, 41, 42]),
    ]
    model_keys = ("input_ids", "attention_mask", "position_ids")
    with torch.no_grad():
        alone = [
            tiny_model(input_ids=torch.as_tensor(f.input_ids).view(1, -1), use_cache=False).logits[
                0
            ]
            for f in feats
        ]
        for processor in (
            InputProcessor(padding_side="right"),
            InputProcessor(padding_side="left"),
            InputProcessor(padding_free=True, pad_to_multiple_of=4),
        ):
            batch = processor(feats)
            inputs = {key: batch[key] for key in model_keys if key in batch}
            logits = tiny_model(**inputs, use_cache=False).logits
            for mine, reference in zip(processor.unpack(logits, batch), alone, strict=True):
                torch.testing.assert_close(mine, reference, atol=1e-5, rtol=1e-4)


# ---- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "error", "match"),
    [
        ([], ValueError, "the batch is empty"),
        (features()[0], TypeError, "must be a list of InputFeatures"),
        ([features()[0], [1, 2]], TypeError, "feature 1 must be an InputFeature or a dict"),
        (
            [features()[0], {"input_ids": [1, 2], "labels": [1]}],
            ValueError,
            "feature 1 is not a valid InputFeature.*labels has 1 tokens but input_ids has 2",
        ),
        ([{"input_ids": []}], ValueError, "feature 0: input_ids must be one non-empty sequence"),
        (
            [{"input_ids": [[1, 2], [3, 4]]}],
            ValueError,
            r"must be one non-empty sequence \(1-D\), got shape \(2, 2\)",
        ),
        (
            [features()[0], {"input_ids": [1, 2]}],
            ValueError,
            "feature 1 has no labels but feature 0 has",
        ),
        (
            [{"input_ids": [1, 2, 3], "position_ids": [0, 2, 3]}],
            ValueError,
            "feature 0: position_ids must start at 0.*token 1 has position 2",
        ),
        (
            [{"input_ids": [1, 2], "position_ids": [1, 2]}],
            ValueError,
            "token 0 has position 1",
        ),
        (
            [{"input_ids": [1, 2], "attention_mask": [1, 0]}],
            ValueError,
            "feature 0 is padded",
        ),
    ],
)
def test_bad_batches_name_the_feature_and_the_problem(batch, error, match):
    for processor in (InputProcessor(), InputProcessor(padding_free=True)):
        with pytest.raises(error, match=match):
            processor(batch)


def test_packed_features_cannot_be_padded():
    with pytest.raises(ValueError, match=r"feature 1 is packed.*padding_free=True"):
        InputProcessor(padding_free=False)([features()[0], packed_feature()])


def test_by_default_packed_features_are_collated_padding_free_and_others_padded():
    default, forced = InputProcessor(), InputProcessor(padding_free=True)
    mixed = [features()[0], packed_feature()]
    assert default.padding_free is None
    for key, value in forced(mixed).items():
        assert torch.equal(torch.as_tensor(default(mixed)[key]), torch.as_tensor(value)), key
    padded = default(features())
    assert "attention_mask" in padded and "cu_seq_lens_q" not in padded


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"padding_side": "middle"}, ValueError, "padding_side must be 'right' or 'left'"),
        ({"pad_token_id": -1}, ValueError, "pad_token_id must be a token id"),
        ({"pad_token_id": None}, ValueError, "pad_token_id must be a token id"),
        ({"padding_free": "yes"}, TypeError, "padding_free must be True, False or None"),
        ({"pad_to_multiple_of": 0}, ValueError, "pad_to_multiple_of must be None or a positive"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        InputProcessor(**kwargs)


def test_registered_by_name():
    assert INPUT_PROCESSORS.get("InputProcessor") is InputProcessor
    with pytest.raises(ValueError, match="known: InputProcessor"):
        INPUT_PROCESSORS.get("PaddingProcessor")


def test_collate_fn_batches_a_plain_torch_dataloader_in_worker_processes():
    """``collate_fn`` is what torch's DataLoader calls on each list of items; with worker
    processes the bound method travels pickled with its processor's settings."""
    rows = [{"input_ids": [i] * (i + 1), "labels": [i] * (i + 1)} for i in range(1, 5)]
    processor = InputProcessor(pad_token_id=PAD, padding_side="left")
    loader = torch.utils.data.DataLoader(
        rows, batch_size=2, collate_fn=processor.collate_fn, num_workers=1
    )
    batches = list(loader)
    assert len(batches) == 2
    for batch, pair in zip(batches, [rows[:2], rows[2:]], strict=True):
        assert torch.equal(batch["input_ids"], processor(pair)["input_ids"])
    assert batches[0]["input_ids"].tolist() == [[PAD, 1, 1], [2, 2, 2]]
    assert batches[1]["labels"].tolist() == [[X, X, 3, 3, 3], [X, 4, 4, 4, 4]]


def test_dicts_of_int_lists_collate_as_their_input_features_do():
    rows = [
        {"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "length": 3},
        {"input_ids": [8], "labels": [8], "attention_mask": [1]},
        {"input_ids": [1, 2, 3, 4], "labels": [1, 2, 3, 4], "position_ids": [0, 1, 0, 1]},
    ]
    features = [InputFeature(**row) for row in rows]
    for processor in (InputProcessor(), InputProcessor(padding_free=True)):
        for key, value in processor(features[:2]).items():
            assert torch.equal(torch.as_tensor(processor(rows[:2])[key]), torch.as_tensor(value))
    packed = InputProcessor(padding_free=True)
    for key, value in packed(features).items():
        assert torch.equal(torch.as_tensor(packed(rows)[key]), torch.as_tensor(value)), key
