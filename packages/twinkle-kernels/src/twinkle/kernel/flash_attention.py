"""flash-attn's varlen kernels as the fast paths of ``varlen_attention`` and of
``varlen_attention_lse`` (forward and backward) on CUDA. Registered by name; ``flash_attn`` is
imported the first time a CUDA tensor asks (see ``registry``).

The log-sum-exp pair calls flash-attn's ``_flash_attn_varlen_forward`` and
``_flash_attn_varlen_backward``, which its autograd function is built on: they are not its
documented API, but the only one that returns the lse and takes a given one back (what ring
attention needs, as ring-flash-attention and torch's context parallel use them). Their
window arguments changed in flash-attn 2.6 (``window_size`` -> ``window_size_left/right``,
``softcap`` added); both forms are handled by version.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from twinkle.kernel import registry
from twinkle.kernel.varlen_attention import OP as VARLEN_ATTENTION
from twinkle.kernel.varlen_attention_lse import BACKWARD_OP as LSE_BACKWARD
from twinkle.kernel.varlen_attention_lse import OP as VARLEN_ATTENTION_LSE

PACKAGE = "flash_attn"


def load_varlen_attention() -> Callable:
    kernel = importlib.import_module("flash_attn").flash_attn_varlen_func

    def run(q, k, v, cu_seqlens, max_seqlen, scale=None):
        bounds = cu_seqlens.to(torch.int32)  # flash-attn takes int32 boundaries
        return kernel(
            q, k, v, bounds, bounds, max_seqlen, max_seqlen, softmax_scale=scale, causal=True
        )

    return run


def _window_arguments(version: str) -> dict:
    """No sliding window, in the keywords of flash-attn ``version``'s private functions."""
    major, minor = (int(part) for part in version.split(".")[:2])
    if (major, minor) >= (2, 6):
        return {"window_size_left": -1, "window_size_right": -1, "softcap": 0.0}
    return {"window_size": (-1, -1)}


def _private_kernels():
    """flash-attn's version, its private varlen interface and a function from a block's
    sequences, scale and mask kind to the keywords its forward and backward share."""
    version = importlib.import_module("flash_attn").__version__
    window = _window_arguments(version)

    def shared(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal) -> dict:
        return {
            "cu_seqlens_q": cu_seqlens_q.to(torch.int32),
            "cu_seqlens_k": cu_seqlens_k.to(torch.int32),
            "max_seqlen_q": max_seqlen_q,
            "max_seqlen_k": max_seqlen_k,
            "dropout_p": 0.0,
            "softmax_scale": scale,
            "causal": causal,
            "alibi_slopes": None,
            **window,
        }

    return version, importlib.import_module("flash_attn.flash_attn_interface"), shared


def load_varlen_attention_lse() -> Callable:
    version, interface, shared = _private_kernels()

    def run(q, k, v, *block):
        out, lse, *_ = interface._flash_attn_varlen_forward(
            q=q, k=k, v=v, return_softmax=False, **shared(*block)
        )
        if lse.shape != (q.shape[1], q.shape[0]):
            raise RuntimeError(
                f"flash-attn {version} returned a varlen lse of shape {tuple(lse.shape)}, not "
                f"(heads, tokens) = {(q.shape[1], q.shape[0])}; ring attention needs "
                "flash-attn 2.4 or later"
            )
        return out, lse

    return run


def load_varlen_attention_lse_backward() -> Callable:
    _, interface, shared = _private_kernels()

    def run(dout, q, k, v, out, lse, *block):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        interface._flash_attn_varlen_backward(
            dout=dout.to(q.dtype).contiguous(),
            q=q,
            k=k,
            v=v,
            out=out.to(q.dtype).contiguous(),
            softmax_lse=lse.to(torch.float32).contiguous(),
            dq=dq,
            dk=dk,
            dv=dv,
            deterministic=False,
            rng_state=None,
            **shared(*block),
        )
        return dq, dk, dv

    return run


registry.register_fast_path(
    VARLEN_ATTENTION,
    registry.FastPath("flash_attn", PACKAGE, frozenset({"cuda"}), load_varlen_attention),
)
registry.register_fast_path(
    VARLEN_ATTENTION_LSE,
    registry.FastPath("flash_attn", PACKAGE, frozenset({"cuda"}), load_varlen_attention_lse),
)
registry.register_fast_path(
    LSE_BACKWARD,
    registry.FastPath(
        "flash_attn", PACKAGE, frozenset({"cuda"}), load_varlen_attention_lse_backward
    ),
)
