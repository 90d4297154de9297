"""A Hugging Face config, read as a Megatron GPTModel: the TransformerConfig and model arguments.

Supported families: those whose family file (``twinkle.model.families``) declares
MegatronRules: Qwen3 (q/k RMSNorm), Qwen3-MoE (every layer a mixture of experts, no
auxiliary loss in the training loss, as the Hugging Face model computes it), Qwen2,
Llama, Mistral (optional q/k/v bias), Phi-3 / Phi-4 (fused projections, partial
rotary), GLM-4.5 and DeepSeek-V3 (sigmoid routing with a fixed load-balancing bias,
shared experts, dense first layers; DeepSeek-V3's multi-head latent attention, not under
context parallel), all with RoPE, RMSNorm and SwiGLU MLPs. Anything that
would silently change the maths (rope scaling, sliding windows, biases on other
linears) is refused by name.

The vocabulary is padded to a multiple of tp (Megatron splits the embedding rows
evenly); the padding rows never reach a loss: ``logps`` masks them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from twinkle.model.families import family_of, known_families

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class GPTSpec:
    """What conversion and the model need to agree on, derived once from the HF config."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int
    qk_norm: bool
    qkv_bias: bool
    tie_embeddings: bool
    rope_theta: float
    norm_eps: float
    max_positions: int
    num_experts: int = 0
    moe_ffn_hidden_size: int = 0
    topk: int = 0
    # Hugging Face renormalises the top-k softmax weights (norm_topk_prob), which equals
    # Megatron's softmax over the top-k logits; without renormalisation, Megatron's
    # pre-softmax routing (softmax over all experts, then top-k) is the same maths.
    pre_softmax: bool = False
    # Sigmoid routing (DeepSeek-V3, GLM-4.5): the score function, a load-balancing bias on
    # the scores that choose the experts, group-limited top-k (0: none), the weights'
    # scaling factor, the shared experts' width (0: none) and which layers are MoE ones
    # (empty: all).
    score_function: str = "softmax"
    expert_bias: bool = False
    num_groups: int = 0
    group_topk: int = 0
    scaling_factor: float = 0.0
    shared_ffn_hidden_size: int = 0
    moe_layers: tuple[bool, ...] = ()
    # Multi-head latent attention's settings (MLATransformerConfig's names), or empty.
    mla: dict = field(default_factory=dict, compare=False)
    # The share of each head's dimensions RoPE rotates (the first ones; Phi-4-mini, GLM-4.5).
    rotary_percent: float = 1.0
    # The family's layer weight names (MegatronRules.weights).
    weights: dict = field(default_factory=dict, compare=False, repr=False)
    # Why MegatronModel's LoRA does not fit the family (MegatronRules.lora), or None.
    lora_refused: str | None = None

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads


def _rope_theta(hf_config: Any) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(
            f"rope_type {rope_type!r} is not supported by MegatronModel yet (only plain RoPE); "
            "use TransformersModel for this model"
        )
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ValueError("the model config has no rope_theta")
    return float(theta)


def _rotary_percent(hf_config: Any, head_dim: int) -> float:
    params = getattr(hf_config, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0))
    factor = 1.0 if factor is None else float(factor)
    rotated = head_dim * factor
    if not 0 < factor <= 1 or rotated != int(rotated) or int(rotated) % 2:
        raise ValueError(
            f"partial_rotary_factor={factor} rotates {rotated} of the {head_dim} dimensions of "
            "a head; MegatronModel needs an even whole number of them"
        )
    return factor


def _refuse_sliding_windows(hf_config: Any) -> None:
    layer_types = getattr(hf_config, "layer_types", None) or ()
    windowed = "sliding_attention" in layer_types or (
        not layer_types
        and getattr(hf_config, "sliding_window", None) is not None
        and getattr(hf_config, "use_sliding_window", True)
    )
    if windowed:
        raise ValueError(
            f"sliding-window attention (sliding_window={hf_config.sliding_window}) is not "
            "supported by MegatronModel; set sliding_window=None in the config if the "
            "sequences are never longer than the window, or use TransformersModel"
        )


def gpt_spec(hf_config: Any, tp: int) -> GPTSpec:
    """Read the HF config; refuse what the converted model would compute differently."""
    model_type = hf_config.model_type
    family = family_of(hf_config)
    rules = None if family is None else family.megatron
    if rules is None:
        converted = known_families(lambda f: f.megatron is not None)
        if family is not None and family.megatron_missing:
            raise ValueError(
                f"MegatronModel does not convert {family.name} ({model_type!r}): "
                f"{family.megatron_missing}. It converts the {converted} families; train "
                f"{family.name} with TransformersModel"
            )
        raise ValueError(
            f"MegatronModel converts the {converted} families; {model_type!r} is not one of "
            "them (use TransformersModel)"
        )
    _refuse_sliding_windows(hf_config)
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError("MLP biases are not supported by MegatronModel")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {hf_config.hidden_act!r}: MegatronModel supports 'silu'")
    heads = hf_config.num_attention_heads
    vocab = hf_config.vocab_size
    moe = {} if rules.moe is None else rules.moe(hf_config)
    qkv_bias = bool(getattr(hf_config, "attention_bias", rules.qkv_bias))
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return GPTSpec(
        model_type=model_type,
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        ffn_hidden_size=hf_config.intermediate_size,
        vocab_size=vocab,
        padded_vocab_size=-(-vocab // tp) * tp,
        qk_norm=bool(rules.qk_norm(hf_config) if callable(rules.qk_norm) else rules.qk_norm),
        qkv_bias=qkv_bias,
        tie_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        rope_theta=_rope_theta(hf_config),
        norm_eps=hf_config.rms_norm_eps,
        max_positions=hf_config.max_position_embeddings,
        rotary_percent=_rotary_percent(hf_config, head_dim),
        weights=rules.weights,
        mla={} if rules.attention is None else rules.attention(hf_config),
        lora_refused=rules.lora,
        **moe,
    )


def _keep(weight: torch.Tensor) -> None:
    """An init method that leaves the weight as allocated (conversion fills it)."""


def transformer_config(spec: GPTSpec, layout: Any, precision: str, on_accelerator: bool):
    """Megatron's TransformerConfig for ``spec`` under ``layout``, with the local layer spec.

    Conversion overwrites every weight, so the init methods do nothing. NOTE:
    ``perform_initialization`` must stay True even so: megatron-core 0.16 marks
    tensor-parallel weights (``tensor_model_parallel``) only inside its init path, and
    unmarked shards are counted as duplicates by the gradient-norm and clipping code.
    """
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    dtype = _DTYPES[precision]
    moe = {}
    if spec.num_experts:
        moe = dict(
            num_moe_experts=spec.num_experts,
            moe_ffn_hidden_size=spec.moe_ffn_hidden_size,
            moe_router_topk=spec.topk,
            moe_router_pre_softmax=spec.pre_softmax,
            moe_router_load_balancing_type="none",
            moe_aux_loss_coeff=0.0,
            expert_tensor_parallel_size=layout.expert_tp,
            # alltoall is the fast path on GPUs; allgather needs no CUDA stream.
            moe_token_dispatcher_type="alltoall" if on_accelerator else "allgather",
        )
        if spec.moe_layers:
            moe["moe_layer_freq"] = [int(m) for m in spec.moe_layers]
        if spec.score_function != "softmax":
            moe.update(
                moe_router_score_function=spec.score_function,
                # transformers computes these routers in float32 whatever the model's dtype
                moe_router_dtype="fp32",
            )
        if spec.expert_bias:
            # transformers keeps the bias fixed; megatron-core would move it every step.
            moe.update(moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0.0)
        if spec.num_groups:
            moe.update(moe_router_num_groups=spec.num_groups, moe_router_group_topk=spec.group_topk)
        if spec.scaling_factor:
            moe["moe_router_topk_scaling_factor"] = spec.scaling_factor
        if spec.shared_ffn_hidden_size:
            moe["moe_shared_expert_intermediate_size"] = spec.shared_ffn_hidden_size
    attention = {}
    if spec.mla:
        if layout.cp > 1:
            raise ValueError(
                "cp_size > 1 with multi-head latent attention: MegatronModel's context "
                "parallel covers standard attention only"
            )
        attention = dict(
            **spec.mla,
            rope_type="rope",
            rotary_base=spec.rope_theta,
            rotary_percent=spec.rotary_percent,
            rotary_scaling_factor=1.0,  # no yarn: the softmax scale stays 1/sqrt(head dim)
        )
    return (MLATransformerConfig if spec.mla else TransformerConfig)(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads,
        kv_channels=spec.head_dim,
        ffn_hidden_size=spec.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=spec.norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=spec.qkv_bias,
        qk_layernorm=spec.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        sequence_parallel=layout.sequence_parallel,
        params_dtype=dtype,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        pipeline_dtype=dtype,
        autocast_dtype=dtype,
        use_cpu_initialization=not on_accelerator,
        perform_initialization=True,
        init_method=_keep,
        output_layer_init_method=_keep,
        # Losses return sums and the step divides by the token count (TwinkleModel's contract).
        calculate_per_token_loss=True,
        # The fused kernels need CUDA extensions; the unfused paths compute the same.
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        deallocate_pipeline_outputs=on_accelerator,
        **moe,
        **attention,
    )
