"""The varlen gated delta rule equals each sequence run alone, forward and backward.

The per-sequence reference is transformers' token-by-token recurrence
(``torch_recurrent_gated_delta_rule``, the math Qwen3.5 runs), an implementation
independent of ours. Tolerance: 1e-5 absolute and relative, float32.
"""

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

from twinkle.kernel import chunk_gated_delta_rule, torch_chunk_gated_delta_rule

TOL = {"atol": 1e-5, "rtol": 1e-5}
LAYOUTS = {
    "one token each": [1, 1, 1],
    "mixed with ones": [1, 7, 64, 1, 65, 3],
    "crossing chunks": [130, 2, 63],
    "single long": [150],
}


def random_inputs(total, heads=2, value_heads=4, key_dim=8, value_dim=6, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).requires_grad_()

    q, k = randn(1, total, heads, key_dim), randn(1, total, heads, key_dim)
    v = randn(1, total, value_heads, value_dim)
    g = (-torch.rand(1, total, value_heads, generator=generator) * 2).requires_grad_()
    beta = torch.rand(1, total, value_heads, generator=generator).requires_grad_()
    return q, k, v, g, beta


def cu_seqlens_of(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def per_sequence(inputs, lengths, initial_state=None):
    bounds = cu_seqlens_of(lengths).tolist()
    outs, states = [], []
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        q, k, v, g, beta = (x[:, a:b] for x in inputs)
        out, state = torch_recurrent_gated_delta_rule(
            q,
            k,
            v,
            g=g,
            beta=beta,
            initial_state=None if initial_state is None else initial_state[i : i + 1],
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        outs.append(out)
        states.append(state)
    return torch.cat(outs, 1), torch.cat(states)


def grads(outputs, inputs, seed=1):
    """Gradients of a random linear function of every output."""
    generator = torch.Generator().manual_seed(seed)
    total = sum((o * torch.randn(o.shape, generator=generator)).sum() for o in outputs)
    return torch.autograd.grad(total, inputs)


@pytest.mark.parametrize("lengths", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_packed_equals_each_sequence_alone_forward_and_backward(lengths):
    inputs = random_inputs(sum(lengths))
    out, state = torch_chunk_gated_delta_rule(
        *inputs,
        use_qk_l2norm_in_kernel=True,
        output_final_state=True,
        cu_seqlens=cu_seqlens_of(lengths),
    )
    ref_out, ref_state = per_sequence(inputs, lengths)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(state, ref_state, **TOL)
    ours = grads([out, state], inputs)
    for a, b in zip(ours, grads([ref_out, ref_state], inputs), strict=True):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("seed", range(4))
def test_random_layouts_and_initial_states(seed):
    generator = torch.Generator().manual_seed(100 + seed)
    count = int(torch.randint(1, 9, (1,), generator=generator))
    lengths = torch.randint(1, 90, (count,), generator=generator).tolist()
    inputs = random_inputs(sum(lengths), heads=3, value_heads=3, seed=seed)
    initial = torch.randn(count, 3, 8, 6, generator=generator).requires_grad_()
    out, state = torch_chunk_gated_delta_rule(
        *inputs,
        initial_state=initial,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu_seqlens_of(lengths),
        chunk_size=16,
    )
    ref_out, ref_state = per_sequence(inputs, lengths, initial)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(state, ref_state, **TOL)
    ours = grads([out, state], (*inputs, initial))
    theirs = grads([ref_out, ref_state], (*inputs, initial))
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_the_state_restarts_at_each_boundary():
    """Changing the first sequence leaves the second one's output untouched."""
    q, k, v, g, beta = (x.detach() for x in random_inputs(20))
    cu_seqlens = cu_seqlens_of([12, 8])
    before, _ = torch_chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_seqlens)
    v2 = v.clone()
    v2[:, :12] += 1.0
    after, _ = torch_chunk_gated_delta_rule(q, k, v2, g, beta, cu_seqlens=cu_seqlens)
    assert not torch.allclose(after[:, :12], before[:, :12])
    assert torch.equal(after[:, 12:], before[:, 12:])
    unpacked, _ = torch_chunk_gated_delta_rule(q, k, v2, g, beta)
    assert not torch.allclose(unpacked[:, 12:], before[:, 12:]), "without cu_seqlens it leaks"


def test_a_batch_without_cu_seqlens_is_one_sequence_per_row():
    inputs = [x.detach() for x in random_inputs(2 * 33)]
    rows = [x.reshape(2, 33, *x.shape[2:]) for x in inputs]
    out, _ = torch_chunk_gated_delta_rule(*rows, scale=0.3)
    packed, _ = torch_chunk_gated_delta_rule(*inputs, scale=0.3, cu_seqlens=cu_seqlens_of([33, 33]))
    torch.testing.assert_close(out.reshape(packed.shape), packed, **TOL)


def test_the_dispatcher_runs_the_reference_on_cpu_and_keeps_the_dtype():
    inputs = [x.detach().to(torch.bfloat16) for x in random_inputs(10)]
    out, state = chunk_gated_delta_rule(*inputs, cu_seqlens=cu_seqlens_of([4, 6]))
    assert out.dtype == torch.bfloat16 and state is None
    ref, _ = torch_chunk_gated_delta_rule(*inputs, cu_seqlens=cu_seqlens_of([4, 6]))
    assert torch.equal(out, ref)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: {**a, "cu_seqlens": torch.tensor([0, 4, 9])}, "rise strictly from 0 to .* 10"),
        (lambda a: {**a, "cu_seqlens": torch.tensor([0, 5, 5, 10])}, "at least one token"),
        (lambda a: {**a, "cu_seqlens": torch.tensor([0.0, 10.0])}, "must hold integers"),
        (lambda a: {**a, "g": a["g"][..., :1]}, "g must be"),
        (lambda a: {**a, "v": a["v"][:, :, :3]}, "multiple of the 2"),
        (lambda a: {**a, "initial_state": torch.zeros(3, 4, 8, 6)}, "initial_state must be"),
    ],
)
def test_bad_inputs_say_what_is_wrong(change, message):
    q, k, v, g, beta = (x.detach() for x in random_inputs(10))
    args = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "cu_seqlens": torch.tensor([0, 10])}
    with pytest.raises(ValueError, match=message):
        torch_chunk_gated_delta_rule(**change(args))


def test_packed_inputs_must_be_one_row():
    q, k, v, g, beta = (torch.cat([x.detach()] * 2) for x in random_inputs(4))
    with pytest.raises(ValueError, match="packed into one row, but q has 2 rows"):
        torch_chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=torch.tensor([0, 4]))
