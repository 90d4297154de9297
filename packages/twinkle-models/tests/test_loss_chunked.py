"""Chunked cross entropy: same values and gradients as the plain loss, without full logits."""

import importlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from twinkle.loss import (
    ChunkedCrossEntropyLoss,
    CrossEntropyLoss,
    GRPOLoss,
    chunked_linear_logps,
    chunked_logps,
    default_chunk_size,
    logps_from_logits,
    prefers_chunked,
)
from twinkle.loss.chunked_logps import max_and_argmax
from twinkle.utils.testing import reduction_tolerance

B, T, H, V = 2, 9, 5, 13


def make_batch(dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, H, generator=gen, dtype=dtype)
    weight = torch.randn(V, H, generator=gen, dtype=dtype)
    bias = torch.randn(V, generator=gen, dtype=dtype)
    labels = torch.randint(0, V, (B, T), generator=gen)
    labels[0, :4] = -100
    labels[1, 6] = -100
    return hidden, weight, bias, labels


def leaves(*tensors):
    return [t.clone().requires_grad_() for t in tensors]


def plain_loss(hidden, weight, bias, labels):
    logits = hidden @ weight.T + (0 if bias is None else bias)
    return CrossEntropyLoss()({"labels": labels}, {"logits": logits})


@pytest.mark.parametrize("chunk_size", [1, 3, 4, 14, None])
@pytest.mark.parametrize("with_bias", [True, False])
def test_values_and_gradients_match_the_plain_loss(chunk_size, with_bias):
    hidden, weight, bias, labels = make_batch()
    bias = bias if with_bias else None
    h1, w1 = leaves(hidden, weight)
    h2, w2 = leaves(hidden, weight)
    b1, b2 = leaves(bias, bias) if with_bias else (None, None)
    plain = plain_loss(h1, w1, b1, labels)
    outputs = {"hidden_states": h2, "lm_head_weight": w2, "lm_head_bias": b2}
    chunked = ChunkedCrossEntropyLoss(chunk_size=chunk_size)({"labels": labels}, outputs)
    assert chunked["num_tokens"].item() == plain["num_tokens"].item() == 12
    torch.testing.assert_close(chunked["loss"], plain["loss"], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunked["logps"], plain["logps"], rtol=1e-12, atol=1e-12)
    assert torch.equal(chunked["predicted_ids"], plain["predicted_ids"])
    (2.5 * plain["loss"]).backward()
    (2.5 * chunked["loss"]).backward()  # a non-unit upstream gradient must be honoured
    for ours, ref in [(h2, h1), (w2, w1)] + ([(b2, b1)] if with_bias else []):
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-10, atol=1e-12)


def test_per_token_logps_carry_per_token_gradients():
    """RL losses weigh each token differently: chunked logps must back-propagate that."""
    hidden, weight, bias, labels = make_batch()
    weights = torch.randn(B, T, dtype=torch.float64)
    h1, w1, b1 = leaves(hidden, weight, bias)
    h2, w2, b2 = leaves(hidden, weight, bias)
    (logps_from_logits(h1 @ w1.T + b1, labels).logps * weights).sum().backward()
    (chunked_logps(h2, w2, labels, b2, chunk_size=2).logps * weights).sum().backward()
    for ours, ref in [(h2, h1), (w2, w1), (b2, b1)]:
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-10, atol=1e-12)


def test_cross_entropy_loss_accepts_hidden_states_too():
    hidden, weight, bias, labels = make_batch()
    outputs = {"hidden_states": hidden, "lm_head_weight": weight, "lm_head_bias": bias}
    ours = CrossEntropyLoss()({"labels": labels}, outputs)
    ref = plain_loss(hidden, weight, bias, labels)
    torch.testing.assert_close(ours["loss"], ref["loss"], rtol=1e-12, atol=1e-12)


def test_rl_losses_read_hidden_states_through_the_chunked_path():
    hidden, weight, bias, labels = make_batch()
    advantages = torch.tensor([0.7, -1.3], dtype=torch.float64)
    old = plain_loss(hidden, weight, bias, labels)["logps"] + 0.1
    h1, w1, b1 = leaves(hidden, weight, bias)
    h2, w2, b2 = leaves(hidden, weight, bias)
    kwargs = {"advantages": advantages, "old_logps": old}
    loss = GRPOLoss()
    plain = loss({"labels": labels}, {"logits": h1 @ w1.T + b1}, **kwargs)["loss"]
    outputs = {"hidden_states": h2, "lm_head_weight": w2, "lm_head_bias": b2}
    chunked = loss({"labels": labels}, outputs, **kwargs)["loss"]
    torch.testing.assert_close(chunked, plain, rtol=1e-12, atol=1e-12)
    plain.backward()
    chunked.backward()
    for ours, ref in [(h2, h1), (w2, w1), (b2, b1)]:
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-10, atol=1e-12)


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor (of ``dtype``, if given) any op
    produces."""

    def __init__(self, dtype=None):
        super().__init__()
        self.dtype = dtype
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for item in out if isinstance(out, tuple | list) else [out]:
            if isinstance(item, torch.Tensor) and self.dtype in (None, item.dtype):
                self.largest = max(self.largest, item.numel())
        return out


def test_no_op_ever_holds_more_than_one_chunk_of_logits():
    tokens, hidden_size, vocab, chunk = 64, 4, 1000, 8
    hidden = torch.randn(1, tokens, hidden_size, requires_grad=True)
    weight = torch.randn(vocab, hidden_size, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    outputs = {"hidden_states": hidden, "lm_head_weight": weight}
    with LargestTensor() as probe:
        ChunkedCrossEntropyLoss(chunk)({"labels": labels}, outputs)["loss"].backward()
    assert probe.largest <= chunk * vocab  # the plain path would hold 63 * 1000
    with LargestTensor() as probe:
        plain_loss(hidden, weight, None, labels)["loss"].backward()
    assert probe.largest >= (tokens - 1) * vocab  # the probe does see full logits


def test_prompt_tokens_get_no_logits():
    tokens, vocab = 64, 1000
    hidden = torch.randn(1, tokens, 4, requires_grad=True)
    weight = torch.randn(vocab, 4, requires_grad=True)
    labels = torch.full((1, tokens), -100)
    labels[0, -5:] = 7  # a long prompt, a short completion
    outputs = {"hidden_states": hidden, "lm_head_weight": weight}
    with LargestTensor() as probe:
        ChunkedCrossEntropyLoss(chunk_size=1000)({"labels": labels}, outputs)["loss"].backward()
    assert probe.largest == 5 * vocab


@pytest.mark.parametrize("chunk_size", [1, 3, 5])
def test_logits_path_in_chunks_matches_one_chunk(chunk_size):
    hidden, weight, bias, labels = make_batch()
    logits = hidden @ weight.T + bias
    weights = torch.randn(B, T, dtype=torch.float64)
    (whole,) = leaves(logits)
    (chunked,) = leaves(logits)
    one = logps_from_logits(whole, labels)
    many = logps_from_logits(chunked, labels, chunk_size=chunk_size)
    torch.testing.assert_close(many.logps, one.logps, rtol=1e-14, atol=1e-14)
    assert torch.equal(many.predicted_ids, one.predicted_ids)
    (one.logps * weights).sum().backward()
    (many.logps * weights).sum().backward()
    torch.testing.assert_close(chunked.grad, whole.grad, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("chunk_size", [1, 4, None])
def test_both_ways_to_the_exponentials_give_equal_values_and_gradients(chunk_size, monkeypatch):
    """The gathered and hidden-state paths take their exponentials through torch's softmax
    kernels on a CPU and as exp(logits - lse) elsewhere (``_softmax_kernels``): run here
    both ways, values, argmax ids and gradients agree."""
    module = importlib.import_module("twinkle.loss.chunked_logps")
    hidden, weight, bias, labels = make_batch()
    weights = torch.randn(B, T, dtype=torch.float64)
    results = []
    for kernels in (True, False):
        monkeypatch.setattr(module, "_softmax_kernels", lambda device, on=kernels: on)
        h, w, b, logits = leaves(hidden, weight, bias, hidden @ weight.T + bias)
        linear = chunked_logps(h, w, labels, b, chunk_size=chunk_size)
        gathered = logps_from_logits(logits, labels, chunk_size=chunk_size)
        ((linear.logps + gathered.logps) * weights).sum().backward()
        results.append((linear, gathered, h.grad, w.grad, b.grad, logits.grad))
    (linear, gathered, *grads), (linear_e, gathered_e, *grads_e) = results
    for ours, other in [(linear, linear_e), (gathered, gathered_e)]:
        torch.testing.assert_close(ours.logps, other.logps, rtol=1e-13, atol=1e-13)
        assert torch.equal(ours.predicted_ids, other.predicted_ids)
    for ours, other in zip(grads, grads_e, strict=True):
        torch.testing.assert_close(ours, other, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(gathered.logps, reference_logps(hidden @ weight.T + bias, labels))


class GatheredRows(TorchDispatchMode):
    """Counts the rows of ``vocab`` logits that indexing ops copy out (``aten.index``) or
    scatter back (``aten.index_put``)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.rows = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        moved = out if name == "index" else args[2] if name.startswith("index_put") else None
        if moved is not None and moved.dim() == 2 and moved.shape[-1] == self.vocab:
            self.rows += moved.shape[0]
        return out


def reference_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """float64 log_softmax of the logits predicting each label, 0 off the labels."""
    log_probs = torch.log_softmax(logits.double()[:, :-1], -1)
    picked = log_probs.gather(-1, labels[:, 1:, None].clamp(min=0)).squeeze(-1)
    return torch.nn.functional.pad(torch.where(labels[:, 1:] != -100, picked, 0), (1, 0))


@pytest.mark.parametrize("chunk_size", [1, 4, 9, None])
def test_every_token_a_label_reads_the_logits_in_place_with_equal_results(chunk_size):
    """Labels on every position but the first (the rows of a packed, uniform or single-
    sequence batch): the logits are read as views, the gradient written in place; the
    values, argmax ids and gradients equal a float64 log_softmax, and the gathered path's
    (the same labels with one more -100, which gathers the rows)."""
    hidden, weight, bias, labels = make_batch()
    labels = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    logits = hidden @ weight.T + bias
    logits[:, -1] = float("nan")  # predicts nothing: must not reach the values or gradients
    weights = torch.randn(B, T, dtype=torch.float64)
    (dense,) = leaves(logits)
    with GatheredRows(V) as probe:
        out = logps_from_logits(dense, labels, chunk_size=chunk_size)
        (out.logps * weights).sum().backward()
    assert probe.rows == 0  # no row of logits was copied out or scattered back
    (ref,) = leaves(logits)
    (reference_logps(ref, labels) * weights).sum().backward()
    torch.testing.assert_close(out.logps, reference_logps(logits, labels), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(dense.grad, ref.grad.nan_to_num(0.0), rtol=1e-12, atol=1e-14)
    assert torch.equal(dense.grad[:, -1], torch.zeros(B, V, dtype=torch.float64))
    expected_ids = torch.nn.functional.pad(logits[:, :-1].argmax(-1), (1, 0), value=-100)
    assert torch.equal(out.predicted_ids, expected_ids)
    sparse_labels = labels.clone()
    sparse_labels[1, 3] = -100
    (gathered,) = leaves(logits)
    with GatheredRows(V) as probe:
        sparse = logps_from_logits(gathered, sparse_labels, chunk_size=chunk_size)
        (sparse.logps * weights).sum().backward()
    assert probe.rows >= 2 * (B * (T - 1) - 1)  # gathered in forward and again in backward
    keep = sparse_labels != -100
    torch.testing.assert_close(sparse.logps[keep], out.logps[keep], rtol=1e-14, atol=1e-14)
    row_kept = torch.ones(B, T, 1, dtype=torch.bool)
    row_kept[1, 2] = False  # the position that predicted the dropped label
    torch.testing.assert_close(
        gathered.grad, torch.where(row_kept, dense.grad, 0), rtol=1e-12, atol=1e-14
    )


def test_as_many_labels_as_every_position_but_placed_elsewhere_are_gathered():
    """B x (T - 1) labels that are not every position but the first (one at t = 0, which
    nothing predicts, and a -100 inside each row) take the gathered path: the in-place path is
    chosen by the labels' layout, not their count. Values and gradients equal a float64
    log_softmax of the labels that are predicted."""
    logits = torch.randn(B, T, V, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    labels = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(3))
    labels[0, 6] = labels[1, 4] = -100
    assert int((labels != -100).sum()) == B * (T - 1)
    weights = torch.randn(B, T, dtype=torch.float64)
    (ours,) = leaves(logits)
    with GatheredRows(V) as probe:
        out = logps_from_logits(ours, labels)
        (out.logps * weights).sum().backward()
    assert probe.rows >= 2 * (B * (T - 1) - B)  # the predicted labels, forward and backward
    (ref,) = leaves(logits)
    (reference_logps(ref, labels) * weights).sum().backward()
    torch.testing.assert_close(out.logps, reference_logps(logits, labels), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-12, atol=1e-14)
    assert not ours.grad[0, 5].any() and not ours.grad[1, 3].any() and not ours.grad[:, -1].any()
    assert (out.predicted_ids[:, 0] == -100).all()
    assert out.predicted_ids[0, 6] == out.predicted_ids[1, 4] == -100


@pytest.mark.parametrize("vocab", [127, 128, 200, 3909])
def test_max_and_argmax_equals_torch_max_with_ties_nan_and_inf(vocab):
    """The blocked argmax (CPU, rows of 128 or more) gives ``max(dim=-1)``'s values and
    first indices: ties, NaN, -inf rows, and the maximum in the last, shorter block."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-3, 3, (40, vocab), generator=gen).float()  # many ties
    logits[:20] = torch.randn(20, vocab, generator=gen)
    logits[3, 70] = float("nan")
    logits[4, -2:] = float("nan")
    logits[5] = float("-inf")
    logits[6, -1] = 100.0
    logits[7, 64:] = 50.0  # ties across blocks: the first one wins
    top, ids = max_and_argmax(logits)
    expected_top, expected_ids = logits.max(dim=-1)
    assert torch.equal(ids, expected_ids)
    torch.testing.assert_close(top, expected_top, rtol=0, atol=0, equal_nan=True)


def test_bf16_logits_get_float32_temporaries_one_chunk_at_a_time():
    tokens, vocab, chunk = 64, 1000, 8
    logits = torch.randn(1, tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    with LargestTensor(torch.float32) as probe:
        out = logps_from_logits(logits, labels, chunk_size=chunk)
        out.logps.sum().backward()
    assert probe.largest <= chunk * vocab
    assert out.logps.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
    reference = torch.log_softmax(logits.detach().double()[0, :-1], -1)
    expected = reference.gather(1, labels[0, 1:, None]).squeeze(1)
    tol = reduction_tolerance(expected, terms=vocab, dtype=torch.float32)  # float32 logsumexp
    torch.testing.assert_close(out.logps[0, 1:].double(), expected, **tol)
    # Every token is a label here (the in-place path): the gradient is onehot - softmax.
    softmax = torch.softmax(logits.detach().double()[0, :-1], -1)
    onehot = torch.nn.functional.one_hot(labels[0, 1:], vocab).double()
    torch.testing.assert_close(logits.grad[0, :-1].double(), onehot - softmax, rtol=0, atol=4e-3)
    assert not logits.grad[0, -1].any()


def test_autocast_bf16_matches_the_plain_autocast_loss():
    hidden, weight, bias, labels = make_batch(torch.float32)
    h1, w1 = leaves(hidden, weight)
    h2, w2 = leaves(hidden, weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = CrossEntropyLoss()(
            {"labels": labels}, {"logits": torch.nn.functional.linear(h1, w1)}
        )
        outputs = {"hidden_states": h2, "lm_head_weight": w2}
        chunked = ChunkedCrossEntropyLoss(chunk_size=5)({"labels": labels}, outputs)
    assert chunked["loss"].dtype == torch.float32
    tol = reduction_tolerance(plain["loss"], terms=V * labels.numel())  # float32 sums
    torch.testing.assert_close(chunked["loss"], plain["loss"], **tol)
    plain["loss"].backward()
    chunked["loss"].backward()
    assert h2.grad.dtype == torch.float32 and w2.grad.dtype == torch.float32
    torch.testing.assert_close(h2.grad, h1.grad, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=2e-2, atol=2e-2)


def test_bf16_weights_get_bf16_gradients_close_to_float64():
    hidden, weight, bias, labels = make_batch()
    h1, w1 = leaves(hidden, weight)
    h2, w2 = leaves(hidden.bfloat16(), weight.bfloat16())
    plain_loss(h1, w1, None, labels)["loss"].backward()
    outputs = {"hidden_states": h2, "lm_head_weight": w2}
    ChunkedCrossEntropyLoss(chunk_size=3)({"labels": labels}, outputs)["loss"].backward()
    assert w2.grad.dtype == torch.bfloat16
    torch.testing.assert_close(w2.grad.double(), w1.grad, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(h2.grad.double(), h1.grad, rtol=5e-2, atol=5e-2)


def test_chunk_size_defaults_and_when_to_chunk():
    assert default_chunk_size(150_000) == 447  # 256 MiB of float32 logits
    assert default_chunk_size(10**12) == 1
    assert prefers_chunked(4096, 151_936)  # 2.5 GB of float32 logits
    assert not prefers_chunked(512, 32_000)  # 65 MB
    assert prefers_chunked(512, 32_000, limit_bytes=2**20)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ChunkedCrossEntropyLoss(chunk_size=0), "positive number of tokens"),
        (
            lambda: ChunkedCrossEntropyLoss()({"labels": torch.ones(1, 3)}, {"logits": 1}),
            "hidden_states",
        ),
        (
            lambda: chunked_linear_logps(torch.zeros(4, 3), torch.zeros(5, 2), torch.zeros(4)),
            "share H",
        ),
        (
            lambda: chunked_linear_logps(
                torch.zeros(4, 3), torch.zeros(5, 3), torch.zeros(4), bias=torch.zeros(4)
            ),
            r"\(5,\)",
        ),
        (
            lambda: ChunkedCrossEntropyLoss()(
                {"labels": torch.ones(2, 3, dtype=torch.long)},
                {"hidden_states": torch.zeros(2, 4, 3), "lm_head_weight": torch.zeros(5, 3)},
            ),
            "matching labels",
        ),
    ],
)
def test_bad_inputs_say_what_is_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_a_model_with_the_hidden_state_loss_is_told_to_use_cross_entropy():
    """TransformersModel chunks its head itself and hands losses logps, so the hidden-state
    loss has nothing to read there; the error says which loss to set instead."""
    from twinkle.data_format import InputFeature
    from twinkle.model import TransformersModel

    model = TransformersModel(model_id="bundled://tiny-qwen3", device="cpu")
    model.set_loss("ChunkedCrossEntropyLoss")
    row = InputFeature(input_ids=[5, 6, 7, 8], labels=[-100, 6, 7, 8])
    with pytest.raises(ValueError, match="already chunks its head"):
        model.forward_backward(inputs=[row])
