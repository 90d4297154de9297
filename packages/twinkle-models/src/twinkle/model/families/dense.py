"""Dense families with standard attention: Llama 3.x, Mistral, Gemma 3 (q/k norms) and
Phi-3 / Phi-4 (fused qkv and gate/up projections).

MegatronModel converts Llama, Mistral and Phi-3 / Phi-4. Gemma 3 it does not
(``GEMMA3_MEGATRON_MISSING``): megatron-core 0.16 has its sliding-window alternation
(``window_size``, ``window_attn_skip_freq``), q/k norms, ``softmax_scale`` for
query_pre_attn_scalar, the tanh GELU and the tied head, and a (1 + weight) norm is a
conversion rule; what it lacks is named in the refusal.

Phi-3 / Phi-4 have no tensor-parallel plan: its attention slices the fused qkv_proj's output
at the config's whole head counts, which a split projection would not match, and a split of
the fused gate_up_proj that keeps each rank's gate and up together needs a strided DTensor
layout (``_StridedShard``) that torch.distributed.checkpoint cannot save the optimizer state
of (overlapping chunks, torch 2.15)."""

from __future__ import annotations

from twinkle.model.families.base import (
    DECODER_LAYOUT,
    DENSE_TP_PLAN,
    GPT_LAYER_WEIGHTS,
    QK_NORM_TP_PLAN,
    MegatronRules,
    ModelFamily,
)

PHI3_MEGATRON = MegatronRules(
    # One fused [q; k; v] projection and one [gate; up]: the same Megatron layers, read
    # from one Hugging Face tensor each.
    weights={
        **GPT_LAYER_WEIGHTS,
        "self_attention.linear_qkv.weight": ("qkv_fused", ("self_attn.qkv_proj.weight",)),
        "mlp.linear_fc1.weight": ("fc1_fused", ("mlp.gate_up_proj.weight",)),
    },
    lora="Phi-3 fuses its projections (qkv_proj, gate_up_proj), while MegatronModel's LoRA "
    "keeps peft's separate q/k/v/o/gate/up/down form; train LoRA on it with TransformersModel",
)

LLAMA = ModelFamily(
    "llama", ("llama",), megatron=MegatronRules(), tp_plan=DENSE_TP_PLAN, pipeline=DECODER_LAYOUT
)
MISTRAL = ModelFamily("mistral", ("mistral",), megatron=MegatronRules(), tp_plan=DENSE_TP_PLAN)
GEMMA3_MEGATRON_MISSING = (
    "megatron-core 0.16's GPT layer normalises only the inputs of attention and the MLP "
    "(TransformerLayer has no norm after them: Gemma 3's post_attention_layernorm and "
    "post_feedforward_layernorm), its GPTModel builds one rotary embedding for every layer "
    "(Gemma 3's rope_parameters give its sliding_attention and full_attention layers two "
    "rope_theta, 1e4 and 1e6) and does not scale the token embeddings (Gemma 3 multiplies them by "
    "sqrt(hidden_size))"
)
GEMMA3 = ModelFamily(
    "gemma3",
    ("gemma3_text", "gemma3"),
    tp_plan=QK_NORM_TP_PLAN,
    megatron_missing=GEMMA3_MEGATRON_MISSING,
)
PHI3 = ModelFamily("phi3", ("phi3",), megatron=PHI3_MEGATRON)
