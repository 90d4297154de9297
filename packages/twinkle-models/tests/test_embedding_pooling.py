"""Pooling for embedding training: every layout InputProcessor makes, checked token by token
against indices computed by hand from the sequence lengths."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle.model.embedding import POOLINGS, group_labels, pool, sequence_bounds
from twinkle.processor import InputProcessor

LENGTHS = [3, 5, 1]


def features(lengths):
    return [{"input_ids": list(range(10, 10 + n))} for n in lengths]


def positional_states(shape, hidden=4):
    """hidden[b, t] = [b, t, b * 100 + t, 1]: each token's state names its own position."""
    rows, width = shape
    b = torch.arange(rows)[:, None].expand(rows, width).float()
    t = torch.arange(width)[None, :].expand(rows, width).float()
    return torch.stack([b, t, b * 100 + t, torch.ones_like(t)], dim=-1)[..., :hidden]


def expected_padded(lengths, width, side):
    """The (row, token) pairs of each sequence's pooled tokens, by hand."""
    out = []
    for row, n in enumerate(lengths):
        first = 0 if side == "right" else width - n
        tokens = list(range(first, first + n))
        out.append([(row, t) for t in tokens])
    return out


def expected_packed(lengths):
    out, offset = [], 0
    for n in lengths:
        out.append([(0, offset + t) for t in range(n)])
        offset += n
    return out


def reference(hidden, spans, pooling):
    rows = []
    for span in spans:
        states = torch.stack([hidden[b, t] for b, t in span])
        pick = {"last": states[-1], "cls": states[0], "mean": states.mean(dim=0)}
        rows.append(pick[pooling])
    return torch.stack(rows)


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("side", ["right", "left"])
def test_padded_rows_pool_their_own_tokens(side, pooling):
    batch = InputProcessor(padding_side=side)(features(LENGTHS))
    hidden = positional_states(batch["input_ids"].shape)
    got = pool(hidden, sequence_bounds(batch), pooling)
    want = reference(hidden, expected_padded(LENGTHS, 5, side), pooling)
    torch.testing.assert_close(got, want)


def test_last_token_indices_by_hand():
    right = InputProcessor(padding_side="right")(features(LENGTHS))
    left = InputProcessor(padding_side="left")(features(LENGTHS))
    hidden = positional_states((3, 5))
    # last real token: right padding at n-1; left padding always at the row's end.
    assert pool(hidden, sequence_bounds(right))[:, :2].tolist() == [[0, 2], [1, 4], [2, 0]]
    assert pool(hidden, sequence_bounds(left))[:, :2].tolist() == [[0, 4], [1, 4], [2, 4]]
    assert pool(hidden, sequence_bounds(left), "cls")[:, :2].tolist() == [[0, 2], [1, 0], [2, 4]]


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("multiple", [None, 8])
def test_padding_free_row_gives_one_embedding_per_sequence(pooling, multiple):
    batch = InputProcessor(padding_free=True, pad_to_multiple_of=multiple)(features(LENGTHS))
    hidden = positional_states(batch["input_ids"].shape)
    got = pool(hidden, sequence_bounds(batch), pooling)
    assert got.shape == (3, 4)  # the padding sequence at the end is not pooled
    torch.testing.assert_close(got, reference(hidden, expected_packed(LENGTHS), pooling))
    if pooling == "last":
        assert got[:, 1].tolist() == [2, 7, 8]


def test_position_ids_alone_split_a_packed_row():
    """Without cu_seq_lens (a hand-built packed batch), restarts of position_ids split it."""
    packed = InputProcessor(padding_free=True)(features(LENGTHS))
    batch = {"input_ids": packed["input_ids"], "position_ids": packed["position_ids"]}
    hidden = positional_states(batch["input_ids"].shape)
    bounds = sequence_bounds(batch)
    assert bounds.packed() and bounds.num_sequences == 3
    assert pool(hidden, bounds)[:, 1].tolist() == [2, 7, 8]
    assert pool(hidden, bounds, "cls")[:, 1].tolist() == [0, 3, 8]


def test_a_packed_feature_in_a_padded_layout_is_split_too():
    """A hand-collated padded row holding two sequences (positions restart) pools both."""
    batch = {
        "input_ids": torch.ones(2, 6, dtype=torch.long),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]),
        "position_ids": torch.tensor([[0, 1, 0, 1, 2, 0], [0, 0, 0, 1, 2, 3]]),
    }
    hidden = positional_states((2, 6))
    assert pool(hidden, sequence_bounds(batch))[:, :2].tolist() == [[0, 1], [0, 4], [1, 5]]


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    layout=st.sampled_from(["right", "left", "packed", "packed8"]),
    pooling=st.sampled_from(POOLINGS),
)
def test_every_layout_matches_the_hand_index(lengths, layout, pooling):
    if layout.startswith("packed"):
        processor = InputProcessor(
            padding_free=True, pad_to_multiple_of=8 if "8" in layout else None
        )
        spans = expected_packed(lengths)
    else:
        processor = InputProcessor(padding_side=layout)
        spans = expected_padded(lengths, max(lengths), layout)
    batch = processor(features(lengths))
    hidden = positional_states(batch["input_ids"].shape)
    got = pool(hidden, sequence_bounds(batch), pooling)
    torch.testing.assert_close(got, reference(hidden, spans, pooling))


def test_gradients_reach_only_the_pooled_tokens():
    batch = InputProcessor(padding_side="left")(features([2, 4]))
    hidden = torch.randn(2, 4, 3, requires_grad=True)
    pool(hidden, sequence_bounds(batch), "last").sum().backward()
    touched = hidden.grad.abs().sum(-1) > 0
    assert touched.tolist() == [[False, False, False, True], [False, False, False, True]]


def test_mean_pooling_is_float32_under_bf16():
    batch = InputProcessor()(features([2, 3]))
    hidden = torch.randn(2, 3, 4).bfloat16()
    assert pool(hidden, sequence_bounds(batch), "mean").dtype == torch.float32
    assert pool(hidden, sequence_bounds(batch), "last").dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("mask", "message"),
    [([[1, 1, 0], [0, 0, 0]], r"rows \[1\]"), ([[1, 0, 1], [1, 1, 1]], r"rows \[0\]")],
)
def test_masks_that_are_not_one_run_of_tokens_are_rejected(mask, message):
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.tensor(mask)}
    with pytest.raises(ValueError, match=message):
        sequence_bounds(batch)


def test_bad_shapes_and_names_are_rejected():
    batch = InputProcessor()(features([2, 3]))
    with pytest.raises(ValueError, match="unknown pooling 'max'; choose one of last, mean, cls"):
        pool(torch.zeros(2, 3, 4), sequence_bounds(batch), "max")
    with pytest.raises(ValueError, match=r"matching input_ids \(2, 3\)"):
        pool(torch.zeros(2, 4, 4), sequence_bounds(batch))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        sequence_bounds({**batch, "attention_mask": torch.ones(2, 4)})
    packed = InputProcessor(padding_free=True)(features([2, 3]))
    with pytest.raises(ValueError, match="must rise strictly from 0 to the row length 5"):
        sequence_bounds({**packed, "cu_seq_lens_q": torch.tensor([0, 3, 3, 5])})


def test_group_labels_follow_the_features():
    flagged = [{"embedding_label": 1}, {"embedding_label": 0}, {"embedding_label": [1, 0, 0]}]
    assert group_labels(flagged).tolist() == [1, 0, 1, 0, 0]
    assert group_labels([{"input_ids": [1]}, {"input_ids": [2]}]) is None
    with pytest.raises(ValueError, match=r"features \[1\] have no 'embedding_label'"):
        group_labels([{"embedding_label": 1}, {"input_ids": [2]}])
