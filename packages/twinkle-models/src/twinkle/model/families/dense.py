"""Dense families with standard attention: Llama 3.x, Mistral, Gemma 3 (q/k norms) and
Phi-3 / Phi-4 (fused qkv and gate/up projections: no tensor-parallel plan yet)."""

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
