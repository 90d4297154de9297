"""DeepSeek-V3 and GLM-4.5: multi-head latent attention (DeepSeek), experts routed by
sigmoid scores with a load-balancing bias and group-limited top-k, one shared-experts MLP
added to every token, dense first layers."""

from __future__ import annotations

from twinkle.model.families.base import ModelFamily, MoeLayout
from twinkle.model.families.routing import own_forward

DEEPSEEK_V3 = ModelFamily(
    "deepseek_v3", ("deepseek_v3",), moe=MoeLayout(route=own_forward, shared="shared_experts")
)
GLM4_MOE = ModelFamily(
    "glm4_moe", ("glm4_moe",), moe=MoeLayout(route=own_forward, shared="shared_experts")
)
