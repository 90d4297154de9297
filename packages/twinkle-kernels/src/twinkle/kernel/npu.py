"""torch_npu's fused operators as fast paths on Ascend NPUs (``TWINKLE_NPU_*`` switch them,
see ``switches``): ``npu_rms_norm``, ``npu_rotary_mul``, ``npu_swiglu``,
``npu_fusion_attention`` (packed ``TND`` layout) and ``npu_grouped_matmul``.

Registered by name; ``torch_npu`` is imported the first time an NPU tensor asks. Not run on
an NPU by this project yet: the calls follow torch_npu's documented signatures.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import torch

from twinkle.kernel import registry
from twinkle.kernel.grouped_matmul import OP as GROUPED_MATMUL
from twinkle.kernel.rms_norm import OP as RMS_NORM
from twinkle.kernel.rotary_embedding import OP as ROTARY_EMBEDDING
from twinkle.kernel.swiglu import OP as SWIGLU
from twinkle.kernel.varlen_attention import OP as VARLEN_ATTENTION

PACKAGE = "torch_npu"
DEVICES = frozenset({"npu"})
CAUSAL_SPARSE_MODE = 3  # npu_fusion_attention: causal, from a compressed 2048 x 2048 mask
MASK_SIZE = 2048


def _torch_npu():
    return importlib.import_module(PACKAGE)


def load_rms_norm() -> Callable:
    kernel = _torch_npu().npu_rms_norm
    return lambda x, weight, eps: kernel(x, weight, epsilon=eps)[0]


def load_rotary_embedding() -> Callable:
    kernel = _torch_npu().npu_rotary_mul

    def run(q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        return kernel(q, cos, sin), kernel(k, cos, sin)

    return run


def load_swiglu() -> Callable:
    kernel = _torch_npu().npu_swiglu
    return lambda gate, up: kernel(torch.cat([gate, up], dim=-1), dim=-1)


@functools.cache
def _causal_mask(device: torch.device) -> torch.Tensor:
    ones = torch.ones(MASK_SIZE, MASK_SIZE, device=device)
    return torch.triu(ones, diagonal=1).bool()


def load_varlen_attention() -> Callable:
    kernel = _torch_npu().npu_fusion_attention

    def run(q, k, v, cu_seqlens, max_seqlen, scale=None):
        ends = tuple(cu_seqlens[1:].tolist())  # TND takes each sequence's end, not the 0
        return kernel(
            q,
            k,
            v,
            q.shape[1],
            "TND",
            atten_mask=_causal_mask(q.device),
            scale=q.shape[-1] ** -0.5 if scale is None else scale,
            sparse_mode=CAUSAL_SPARSE_MODE,
            actual_seq_qlen=ends,
            actual_seq_kvlen=ends,
        )[0]

    return run


def load_grouped_matmul() -> Callable:
    kernel = _torch_npu().npu_grouped_matmul

    def run(x, weight, group_sizes):
        # One x, one stacked weight, one output (split_item=2); group_list holds row counts.
        return kernel(
            [x],
            [weight],
            group_list=group_sizes.long(),
            split_item=2,
            group_type=0,
            group_list_type=1,
        )[0]

    return run


for _op, _load in (
    (RMS_NORM, load_rms_norm),
    (ROTARY_EMBEDDING, load_rotary_embedding),
    (SWIGLU, load_swiglu),
    (VARLEN_ATTENTION, load_varlen_attention),
    (GROUPED_MATMUL, load_grouped_matmul),
):
    registry.register_fast_path(_op, registry.FastPath("torch_npu", PACKAGE, DEVICES, _load))
