"""Build the bundled tiny model folders of the families users train, one per chat format:
a tokenizer carrying the family's special tokens and its chat template (written for
Twinkle from the format's public description: the built-in formats of
``twinkle.template.formats``), the model's
``generation_config.json`` stop tokens, and a 2-layer, hidden-64 model config whose
weights are a random init from a fixed seed (made by the model backend; none stored).

Every tokenizer is the same byte-level BPE, trained once on ``build_tiny_qwen3``'s
corpus, with the family's tokens added: what a family's format needs is its markup and
special tokens, not its real vocabulary (Mistral's and Gemma's real tokenizers are
SentencePiece; the chat text is the same). Running the script twice gives
byte-identical files.

Usage: python build_tiny_families.py [OUTPUT_ROOT]
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import transformers
from build_tiny_qwen3 import MARKUP_TOKENS, corpus
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

HERE = Path(__file__).parent
DEFAULT_ROOT = HERE.parent / "src/twinkle/hub/bundled/models"
FORMATS = HERE.parent / "src/twinkle/template/formats"
BASE_VOCAB = 1024
CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
DEEPSEEK = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
DEEPSEEK_TOOLS = [
    f"<｜tool▁{kind}▁{edge}｜>"
    for kind in ("calls", "call", "outputs", "output")
    for edge in ("begin", "end")
] + ["<｜tool▁sep｜>"]
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "dtype": "float32",
}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
# DeepSeek-style MoE (DeepSeek-V3, GLM-4.5): routed and shared experts, a dense first layer.
ROUTED = {
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
}


@dataclass(frozen=True)
class Family:
    """One bundled folder: its chat template, tokens and model config."""

    folder: str
    template: str
    special: list[str]
    eos: str
    pad: str
    config_class: str
    architecture: str
    config: dict[str, Any]
    bos: str | None = None
    plain: list[str] = field(default_factory=list)  # added, kept by skip_special_tokens
    stops: list[str] = field(default_factory=list)  # generation_config eos besides eos


QWEN35_LINEAR = {
    "layer_types": ["linear_attention", "full_attention"],
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}
FAMILIES = [
    Family(
        "tiny-llama3",
        "llama3.jinja",
        ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>"]
        + ["<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"],
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
        pad="<|finetune_right_pad_id|>",
        stops=["<|end_of_text|>", "<|eom_id|>"],
        config_class="LlamaConfig",
        architecture="LlamaForCausalLM",
        config={"head_dim": 16, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}},
    ),
    Family(
        "tiny-mistral",
        "mistral.jinja",
        ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]"]
        + ["[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"],
        eos="</s>",
        bos="<s>",
        pad="<unk>",
        config_class="MistralConfig",
        architecture="MistralForCausalLM",
        config={"head_dim": 16, "sliding_window": None},
    ),
    Family(
        "tiny-gemma3",
        "gemma3.jinja",
        ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"],
        eos="<eos>",
        bos="<bos>",
        pad="<pad>",
        stops=["<end_of_turn>"],
        config_class="Gemma3TextConfig",
        architecture="Gemma3ForCausalLM",
        config={"head_dim": 16, "sliding_window": 64, "query_pre_attn_scalar": 16},
    ),
    Family(
        "tiny-qwen2.5",
        "qwen2_5.jinja",
        CHATML,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        plain=MARKUP_TOKENS[2:],
        stops=["<|endoftext|>"],
        config_class="Qwen2Config",
        architecture="Qwen2ForCausalLM",
        config={},
    ),
    Family(
        "tiny-qwen3-moe",
        "qwen3.jinja",
        CHATML,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        plain=MARKUP_TOKENS,
        config_class="Qwen3MoeConfig",
        architecture="Qwen3MoeForCausalLM",
        config={"head_dim": 16, **MOE, "norm_topk_prob": True},
    ),
    Family(
        "tiny-qwen3.5",
        "qwen3_5.jinja",
        CHATML,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        plain=MARKUP_TOKENS,
        config_class="Qwen3_5TextConfig",
        architecture="Qwen3_5ForCausalLM",
        config=QWEN35_LINEAR,
    ),
    Family(
        "tiny-qwen3.5-moe",
        "qwen3_5.jinja",
        CHATML,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        plain=MARKUP_TOKENS,
        config_class="Qwen3_5MoeTextConfig",
        architecture="Qwen3_5MoeForCausalLM",
        config={**QWEN35_LINEAR, **MOE, "shared_expert_intermediate_size": 32},
    ),
    Family(
        "tiny-deepseek-v3",
        "deepseek_v3.jinja",
        DEEPSEEK + DEEPSEEK_TOOLS,
        eos="<｜end▁of▁sentence｜>",
        bos="<｜begin▁of▁sentence｜>",
        pad="<｜end▁of▁sentence｜>",
        plain=["<think>", "</think>"],
        config_class="DeepseekV3Config",
        architecture="DeepseekV3ForCausalLM",
        config={
            **ROUTED,
            "n_group": 2,
            "topk_group": 1,
            "kv_lora_rank": 16,
            "q_lora_rank": 32,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "num_key_value_heads": 4,
        },
    ),
    Family(
        "tiny-glm4.5",
        "glm4.jinja",
        ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>"]
        + ["<|observation|>"],
        eos="<|endoftext|>",
        pad="<|endoftext|>",
        plain=["<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>"]
        + ["<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>"],
        stops=["<|user|>", "<|observation|>"],
        config_class="Glm4MoeConfig",
        architecture="Glm4MoeForCausalLM",
        config={
            "head_dim": 16,
            **ROUTED,
            "n_group": 1,
            "topk_group": 1,
        },
    ),
    Family(
        "tiny-phi4",
        "phi4.jinja",
        ["<|endoftext|>", "<|im_start|>", "<|im_sep|>", "<|im_end|>", "<|dummy_85|>"],
        eos="<|im_end|>",
        pad="<|dummy_85|>",
        stops=["<|endoftext|>"],
        config_class="Phi3Config",
        architecture="Phi3ForCausalLM",
        config={"tie_word_embeddings": False, "pad_token_id": None},
    ),
]


def base_tokenizer() -> str:
    """The shared byte-level BPE, as its JSON (each family loads a fresh copy)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BASE_VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    return tokenizer.to_str()


def build_family(family: Family, base: str, output: Path) -> None:
    tokenizer = Tokenizer.from_str(base)
    tokenizer.add_special_tokens(family.special)
    tokenizer.add_tokens(family.plain)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=family.bos,
        eos_token=family.eos,
        pad_token=family.pad,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = (FORMATS / family.template).read_text()
    fast.save_pretrained(output)
    ids = {name: fast.convert_tokens_to_ids(token) for name, token in _special(family).items()}
    options = {**SMALL, **family.config}
    options.setdefault("pad_token_id", ids["pad"])
    config = getattr(transformers, family.config_class)(
        vocab_size=len(fast), bos_token_id=ids.get("bos"), eos_token_id=ids["eos"], **options
    )
    config.architectures = [family.architecture]
    config.save_pretrained(output)
    stops = [ids["eos"], *fast.convert_tokens_to_ids(family.stops)]
    generation = {"eos_token_id": stops if len(stops) > 1 else stops[0]}
    if "bos" in ids:
        generation["bos_token_id"] = ids["bos"]
    _write_json(output / "generation_config.json", generation)
    # Drop the version stamp so rebuilding with another transformers stays byte-identical.
    data = json.loads((output / "config.json").read_text())
    data.pop("transformers_version", None)
    _write_json(output / "config.json", data)


def _special(family: Family) -> dict[str, str]:
    tokens = {"eos": family.eos, "pad": family.pad}
    return tokens if family.bos is None else {**tokens, "bos": family.bos}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def build(root: Path) -> None:
    base = base_tokenizer()
    for family in FAMILIES:
        build_family(family, base, root / family.folder)


if __name__ == "__main__":
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_ROOT)
