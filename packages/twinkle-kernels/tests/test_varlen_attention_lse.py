"""varlen_attention_lse and its backward: the torch reference against sdpa and autograd (in
float64), split into key blocks and merged as ring attention merges them, and the flash-attn
adapter handing the private kernels their arguments in both of their signatures (a fake
flash_attn stands in: no GPU here; benchmarks/gpu/validate.py runs the real ones)."""

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from twinkle.kernel import registry, select
from twinkle.kernel.varlen_attention_lse import (
    BACKWARD_OP,
    OP,
    torch_varlen_attention_lse,
    torch_varlen_attention_lse_backward,
)

HEADS, KV_HEADS, DIM, SCALE = 4, 2, 8, 0.3


def tensors(seed, *shapes):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes]


def autograd_attention(q, k, v, bounds_q, bounds_k, causal):
    """Each sequence through sdpa with an explicit mask (bottom-right causal), and the lse."""
    outs, lses = [], []
    pairs = zip(bounds_q[:-1], bounds_q[1:], bounds_k[:-1], bounds_k[1:], strict=True)
    for q0, q1, k0, k1 in pairs:
        query = q[q0:q1].transpose(0, 1)
        key, value = (t[k0:k1].transpose(0, 1).repeat_interleave(2, 0) for t in (k, v))
        mask = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool)
        if causal:
            mask = mask.tril(k1 - k0 - (q1 - q0))
        outs.append(F.scaled_dot_product_attention(query, key, value, mask, scale=SCALE))
        scores = (query @ key.transpose(-1, -2) * SCALE).masked_fill(~mask, float("-inf"))
        lses.append(torch.logsumexp(scores, -1))
    return torch.cat(outs, 1).transpose(0, 1), torch.cat(lses, 1)


@pytest.mark.parametrize(
    ("bounds_q", "bounds_k", "causal"),
    [([0, 3, 7], [0, 3, 7], True), ([0, 2, 7], [0, 5, 6], False), ([0, 4], [0, 6], True)],
)
def test_the_reference_is_attention_and_its_backward_autograds(bounds_q, bounds_k, causal):
    q, k, v, w = tensors(
        0,
        (bounds_q[-1], HEADS, DIM),
        *[(bounds_k[-1], KV_HEADS, DIM)] * 2,
        (bounds_q[-1], HEADS, DIM),
    )
    cu_q, cu_k = torch.tensor(bounds_q), torch.tensor(bounds_k)
    out, lse = torch_varlen_attention_lse(q, k, v, cu_q, cu_k, None, None, SCALE, causal)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected, expected_lse = autograd_attention(*leaves, bounds_q, bounds_k, causal)
    assert torch.allclose(out, expected, atol=1e-12) and torch.allclose(lse, expected_lse)
    assert lse.shape == (HEADS, bounds_q[-1])
    (expected * w).sum().backward()
    grads = torch_varlen_attention_lse_backward(
        w, q, k, v, out, lse, cu_q, cu_k, None, None, SCALE, causal
    )
    for leaf, grad in zip(leaves, grads, strict=True):
        assert torch.allclose(leaf.grad, grad, atol=1e-12)


def test_two_key_blocks_merged_by_lse_are_the_whole_and_backward_from_the_merged_one():
    """Keys split in two blocks (one sequence, 6 queries, keys 0-3 and 4-8): each block's
    (out, lse), merged, is attention over all 9 keys; each block's backward from the merged
    out and lse sums to the whole's gradients. What ring attention relies on."""
    q, k, v, w = tensors(
        1, (6, HEADS, DIM), (9, KV_HEADS, DIM), (9, KV_HEADS, DIM), (6, HEADS, DIM)
    )
    whole = [torch.tensor([0, 6]), torch.tensor([0, 9])]
    out, lse = torch_varlen_attention_lse(q, k, v, *whole, None, None, SCALE, False)
    halves = [slice(0, 4), slice(4, 9)]
    parts = [
        torch_varlen_attention_lse(
            q, k[h], v[h], whole[0], torch.tensor([0, h.stop - h.start]), None, None, SCALE, False
        )
        for h in halves
    ]
    merged_lse = torch.logaddexp(parts[0][1], parts[1][1])
    weights = [torch.exp(p_lse - merged_lse).transpose(0, 1).unsqueeze(-1) for _, p_lse in parts]
    merged = parts[0][0] * weights[0] + parts[1][0] * weights[1]
    assert torch.allclose(merged, out, atol=1e-12) and torch.allclose(merged_lse, lse)
    whole_grads = torch_varlen_attention_lse_backward(
        w, q, k, v, out, lse, *whole, None, None, SCALE, False
    )
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for h in halves:
        keys = whole[0], torch.tensor([0, h.stop - h.start]), None, None, SCALE, False
        block = torch_varlen_attention_lse_backward(w, q, k[h], v[h], out, lse, *keys)
        dq += block[0]
        dk[h] += block[1]
        dv[h] += block[2]
    for got, expected in zip((dq, dk, dv), whole_grads, strict=True):
        assert torch.allclose(got, expected, atol=1e-12)


SIGNATURES = {
    # flash-attn 2.5: one window_size tuple, no softcap.
    "2.5.9": {"window_size": (-1, -1)},
    # 2.6 and later: window_size_left/right and softcap.
    "2.7.4": {"window_size_left": -1, "window_size_right": -1, "softcap": 0.0},
}


SHARED = {
    "cu_seqlens_q",
    "cu_seqlens_k",
    "max_seqlen_q",
    "max_seqlen_k",
    "dropout_p",
    "softmax_scale",
    "causal",
    "alibi_slopes",
}
FORWARD_KEYS = SHARED | {"q", "k", "v", "return_softmax"}
BACKWARD_KEYS = SHARED | {"dout", "q", "k", "v", "out", "softmax_lse", "dq", "dk", "dv"}
BACKWARD_KEYS |= {"deterministic", "rng_state"}


def _block(kwargs):
    """The reference's sequence, scale and mask arguments from a fake kernel's keywords."""
    bounds = kwargs["cu_seqlens_q"], kwargs["cu_seqlens_k"], None, None
    return (*bounds, kwargs["softmax_scale"], kwargs["causal"])


@pytest.fixture
def fake_flash_attn(monkeypatch):
    """``install(version)``: a fake flash_attn with ``version``'s private varlen functions,
    pretended installed; they check the keywords the adapter passes against that version's,
    record them and compute with the references. Returns (record, interface)."""

    def install(version):
        record, window = [], set(SIGNATURES[version])

        def forward(**kwargs):
            assert set(kwargs) == FORWARD_KEYS | window, set(kwargs) ^ (FORWARD_KEYS | window)
            record.append(("forward", kwargs))
            qkv = kwargs["q"], kwargs["k"], kwargs["v"]
            out, lse = torch_varlen_attention_lse(*qkv, *_block(kwargs))
            return out, lse.float(), None, None

        def backward(**kwargs):
            assert set(kwargs) == BACKWARD_KEYS | window, set(kwargs) ^ (BACKWARD_KEYS | window)
            record.append(("backward", kwargs))
            names = ("dout", "q", "k", "v", "out", "softmax_lse")
            grads = torch_varlen_attention_lse_backward(
                *(kwargs[n] for n in names), *_block(kwargs)
            )
            for into, grad in zip((kwargs["dq"], kwargs["dk"], kwargs["dv"]), grads, strict=True):
                into.copy_(grad)

        interface = types.SimpleNamespace(
            _flash_attn_varlen_forward=forward, _flash_attn_varlen_backward=backward
        )
        package = types.SimpleNamespace(__version__=version, flash_attn_interface=interface)
        monkeypatch.setitem(sys.modules, "flash_attn", package)
        monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", interface)
        return record, interface

    monkeypatch.setattr(registry, "is_installed", lambda name: name == "flash_attn")
    monkeypatch.delenv("TWINKLE_KERNELS", raising=False)
    registry._load.cache_clear()
    yield install
    registry._load.cache_clear()


@pytest.mark.parametrize("version", sorted(SIGNATURES))
def test_the_flash_adapter_passes_each_versions_arguments(version, fake_flash_attn):
    record, _ = fake_flash_attn(version)
    forward, backward = select(OP, "cuda"), select(BACKWARD_OP, "cuda")
    shapes = [(7, HEADS, DIM), (5, KV_HEADS, DIM), (5, KV_HEADS, DIM), (7, HEADS, DIM)]
    q, k, v, w = tensors(2, *shapes)
    block = torch.tensor([0, 3, 7]), torch.tensor([0, 1, 5]), 4, 4, SCALE, False
    out, lse = forward(q, k, v, *block)
    grads = backward(w, q, k, v, out, lse, *block)
    ref = torch_varlen_attention_lse(q, k, v, *block)
    assert torch.allclose(out, ref[0], atol=1e-12) and lse.dtype == torch.float32
    ref_grads = torch_varlen_attention_lse_backward(w, q, k, v, *ref, *block)
    for got, expected in zip(grads, ref_grads, strict=True):
        assert torch.allclose(got, expected, atol=1e-6)  # through the float32 lse
    (_, fwd), (_, bwd) = record
    for seen in (fwd, bwd):
        assert seen["cu_seqlens_q"].dtype == seen["cu_seqlens_k"].dtype == torch.int32
        assert (seen["max_seqlen_q"], seen["max_seqlen_k"], seen["dropout_p"]) == (4, 4, 0.0)
        assert seen["softmax_scale"] == SCALE and seen["causal"] is False
        assert {key: seen[key] for key in SIGNATURES[version]} == SIGNATURES[version]
    assert bwd["deterministic"] is False and bwd["softmax_lse"].dtype == torch.float32


def test_a_flash_lse_in_the_old_padded_layout_is_an_error_naming_the_version(fake_flash_attn):
    _, interface = fake_flash_attn("2.7.4")
    forward = interface._flash_attn_varlen_forward
    interface._flash_attn_varlen_forward = lambda **kw: (forward(**kw)[0], torch.zeros(1, 4, 9))
    q, k, v = tensors(3, (7, HEADS, DIM), (7, KV_HEADS, DIM), (7, KV_HEADS, DIM))
    cu = torch.tensor([0, 7])
    with pytest.raises(RuntimeError, match=r"flash-attn 2.7.4 returned a varlen lse of sh"):
        select(OP, "cuda")(q, k, v, cu, cu, 7, 7, SCALE, True)
