"""Dense families with standard attention: Llama 3.x, Mistral, Gemma 3 (q/k norms) and
Phi-3 / Phi-4 (fused qkv and gate/up projections).

Phi-3 / Phi-4 have no tensor-parallel plan: its attention slices the fused qkv_proj's output
at the config's whole head counts, which a split projection would not match, and a split of
the fused gate_up_proj that keeps each rank's gate and up together needs a strided DTensor
layout (``_StridedShard``) that torch.distributed.checkpoint cannot save the optimizer state
of (overlapping chunks, torch 2.15)."""

from __future__ import annotations

from twinkle.model.families.base import (
    DECODER_LAYOUT,
    DENSE_TP_PLAN,
    QK_NORM_TP_PLAN,
    MegatronRules,
    ModelFamily,
)

LLAMA = ModelFamily(
    "llama", ("llama",), megatron=MegatronRules(), tp_plan=DENSE_TP_PLAN, pipeline=DECODER_LAYOUT
)
MISTRAL = ModelFamily("mistral", ("mistral",), tp_plan=DENSE_TP_PLAN)
GEMMA3 = ModelFamily("gemma3", ("gemma3_text", "gemma3"), tp_plan=QK_NORM_TP_PLAN)
PHI3 = ModelFamily("phi3", ("phi3",))
