"""A local model folder of a Qwen3 shape with random weights, for GPU checks with no hub.

The config is the named shape's (``SHAPES``), the tokenizer and chat template the bundled
tiny-qwen3's (its ids fit in any of these vocabularies). ``--weights`` writes random bf16
safetensors (``save_pretrained``; built on the GPU when there is one); without it the folder
holds the config and tokenizer only, which vLLM loads with ``load_format='dummy'`` (random
weights of its own, in seconds) and TransformersModel builds from ``config=``.

    python benchmarks/gpu/random_model.py --shape qwen3-0.6b --out /tmp/qwen3-0.6b --weights
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

SHAPES = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
}  # fmt: skip
COMMON = dict(vocab_size=151_936, head_dim=128, max_position_embeddings=40_960, eos_token_id=2)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def config_of(shape: str, layers: int | None = None):
    """The transformers config of ``shape`` (``layers`` overrides its depth)."""
    from transformers import Qwen3Config

    fields = {**COMMON, **SHAPES[shape]}
    if layers is not None:
        fields["num_hidden_layers"] = layers
    return Qwen3Config(**fields, dtype="bfloat16")


def write(shape: str, out: Path, weights: bool, layers: int | None = None) -> Path:
    """The folder ``out`` holding ``shape``'s config, the bundled tokenizer and, with
    ``weights``, random bf16 weights."""
    from transformers import AutoModelForCausalLM

    from twinkle.hub import resolve_model

    out.mkdir(parents=True, exist_ok=True)
    config = config_of(shape, layers)
    tokenizer = Path(resolve_model("bundled://tiny-qwen3"))
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer / name, out / name)
    if not weights:
        config.save_pretrained(out)
        return out
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--weights", action="store_true", help="also write random weights")
    parser.add_argument("--layers", type=int, help="override the shape's depth")
    args = parser.parse_args(argv)
    print(write(args.shape, args.out, args.weights, args.layers))


if __name__ == "__main__":
    main()
