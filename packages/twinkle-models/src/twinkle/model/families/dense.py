"""Dense families with standard attention: Llama 3.x, Mistral, Gemma 3 and Phi-3 / Phi-4
(whose configs carry their own tensor-parallel plans)."""

from __future__ import annotations

from twinkle.model.families.base import MegatronRules, ModelFamily

LLAMA = ModelFamily("llama", ("llama",), megatron=MegatronRules())
MISTRAL = ModelFamily("mistral", ("mistral",))
GEMMA3 = ModelFamily("gemma3", ("gemma3_text", "gemma3"))
PHI3 = ModelFamily("phi3", ("phi3",))
