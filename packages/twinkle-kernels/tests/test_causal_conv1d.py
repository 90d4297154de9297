"""The varlen causal conv1d equals torch's conv1d on each sequence alone, forward and
backward (tolerance 1e-6, float32), and no token sees the previous sequence."""

import pytest
import torch
import torch.nn.functional as F

from twinkle.kernel import causal_conv1d, torch_causal_conv1d

TOL = {"atol": 1e-6, "rtol": 1e-6}


def conv_alone(x, weight, bias, activation):
    """Reference: left-pad by width - 1 and run a depthwise conv1d, one sequence."""
    width, channels = weight.shape[1], x.shape[-1]
    out = F.conv1d(x.transpose(1, 2), weight.unsqueeze(1), bias, padding=width - 1, groups=channels)
    out = out[..., : x.shape[1]].transpose(1, 2)
    return F.silu(out) if activation else out


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("lengths", [[1, 1], [3, 1, 9, 2], [17]])
def test_packed_equals_each_sequence_alone(lengths, with_bias, activation):
    generator = torch.Generator().manual_seed(len(lengths))
    x = torch.randn(1, sum(lengths), 6, generator=generator, requires_grad=True)
    weight = torch.randn(6, 4, generator=generator, requires_grad=True)
    bias = torch.randn(6, generator=generator, requires_grad=True) if with_bias else None
    bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    out = torch_causal_conv1d(x, weight, bias, activation, torch.tensor(bounds))
    pieces = zip(bounds[:-1], bounds[1:], strict=True)
    ref = torch.cat([conv_alone(x[:, a:b], weight, bias, activation) for a, b in pieces], 1)
    torch.testing.assert_close(out, ref, **TOL)
    probe = torch.randn(out.shape, generator=generator)
    params = [x, weight] + ([bias] if with_bias else [])
    for ours, theirs in zip(
        torch.autograd.grad((out * probe).sum(), params),
        torch.autograd.grad((ref * probe).sum(), params),
        strict=True,
    ):
        torch.testing.assert_close(ours, theirs, **TOL)


def test_without_cu_seqlens_each_row_is_a_sequence_and_dispatch_keeps_dtype():
    x = torch.randn(3, 7, 5)
    weight = torch.randn(5, 3)
    torch.testing.assert_close(causal_conv1d(x, weight), conv_alone(x, weight, None, None), **TOL)
    half = causal_conv1d(x.bfloat16(), weight, activation="silu")
    assert half.dtype == torch.bfloat16


def test_a_sequence_start_does_not_see_the_previous_sequence():
    x = torch.zeros(1, 6, 1)
    x[0, 2] = 1.0  # last token of the first sequence
    out = torch_causal_conv1d(x, torch.ones(1, 4), cu_seqlens=torch.tensor([0, 3, 6]))
    assert out[0, :3, 0].tolist() == [0.0, 0.0, 1.0] and out[0, 3:, 0].tolist() == [0.0] * 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"x": torch.zeros(2, 4)}, r"x must be \[batch, tokens, channels\]"),
        ({"weight": torch.zeros(3, 4)}, r"weight must be \[channels=2, width\]"),
        ({"bias": torch.zeros(3)}, r"bias must be \[channels=2\]"),
        ({"activation": "relu"}, "activation must be one of"),
        ({"cu_seqlens": torch.tensor([0, 3])}, "rise strictly from 0 to the packed length 4"),
        ({"x": torch.zeros(2, 4, 2), "cu_seqlens": torch.tensor([0, 4])}, "x has 2 rows"),
    ],
)
def test_bad_inputs_say_what_is_wrong(args, message):
    kwargs = {"x": torch.zeros(1, 4, 2), "weight": torch.zeros(2, 4), **args}
    with pytest.raises(ValueError, match=message):
        torch_causal_conv1d(**kwargs)
