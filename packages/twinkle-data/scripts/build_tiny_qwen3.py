"""Build the bundled tiny Qwen3 folder: a byte-level BPE tokenizer and a model config.

The tokenizer is trained on a corpus this script writes itself (English and
Chinese sentences about training models, arithmetic, code-like text and chat
markup), so it is reproducible from the repository alone: running the script
twice gives byte-identical files. The model config describes a 2-layer,
hidden-64 Qwen3; its weights are a random init from a fixed seed, made by the
model backend, so none are stored.

Usage: python build_tiny_qwen3.py [OUTPUT_FOLDER]
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config

HERE = Path(__file__).parent
CHAT_TEMPLATE = HERE.parent / "src/twinkle/template/formats/qwen3.jinja"
DEFAULT_OUTPUT = HERE.parent / "src/twinkle/hub/bundled/models/tiny-qwen3"
VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Plain added tokens (not special): they survive decode(skip_special_tokens=True), as in Qwen3.
MARKUP_TOKENS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

ENGLISH = (  # noqa: SIM905  (a paragraph of words reads better than a list)
    "the a an and or but if then else when while for with without to from of in on at by "
    "is are was were be been being have has had do does did will would can could should may "
    "might must I you he she it we they me him her us them my your his its our their this that "
    "these those who what which where why how all any some many much more most few less least "
    "model models train training trained data dataset datasets token tokens tokenizer template "
    "loss gradient gradients optimizer learning rate step steps epoch batch batches sample "
    "samples sequence sequences length label labels mask attention layer layers weight weights "
    "adapter adapters lora rank alpha parallel device devices mesh group groups rank ranks "
    "server client session request response reward rewards policy advantage sampler answer "
    "question questions assistant user system name author help helpful please thank thanks "
    "hello hi yes no number numbers add subtract multiply divide total each per left right "
    "apple apples book books student students teacher day days hour hours minute minutes "
    "dollar dollars price cost buy buys bought sell sells sold give gives gave get gets got "
    "make makes made take takes took first second third last next before after again "
    "large language small tiny big new old good great fast slow correct wrong true false "
    "function call calls tool tools result results value values list dict string int float "
    "python code return import def class self print open file files folder path save load"
).split()

CHINESE = [
    "我是一个由{{AUTHOR}}开发的人工智能助手，我的名字叫{{NAME}}。",
    "你好！很高兴为你服务，有什么可以帮助你的吗？",
    "训练大模型需要数据集、模板、模型和优化器。",
    "这个数据集包含问题和答案，用于监督微调。",
    "请一步一步地思考，然后给出最终答案。",
    "小明有三个苹果，他又买了五个苹果，现在一共有几个苹果？",
    "我们使用序列并行和专家并行来训练更长的序列和更大的模型。",
    "多个用户可以同时在同一个基础模型上训练自己的适配器。",
    "模型的损失在训练过程中逐渐下降。",
    "谁开发了你？你叫什么名字？你能做什么？",
    "我可以回答问题、写代码、翻译文本和帮助学习。",
    "检查点保存了模型权重、优化器状态和训练进度。",
]


def corpus(seed: int = 0) -> list[str]:
    """Text for the tokenizer to learn from, generated deterministically."""
    rng = random.Random(seed)
    lines = []
    for _ in range(4000):
        words = rng.choices(ENGLISH, k=rng.randint(4, 16))
        lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ","]))
    for _ in range(1500):
        a, b = rng.randint(0, 999), rng.randint(1, 99)
        op = rng.choice("+-*/")
        lines.append(f"{a} {op} {b} = <<{a}{op}{b}>>\n#### {rng.randint(0, 9999)}")
    for _ in range(500):
        name = rng.choice(["x", "value", "tokens", "batch", "loss", "step"])
        lines.append(f"def f({name}):\n    return {name} + {rng.randint(0, 99)}\n")
    for _ in range(300):
        lines.extend(rng.sample(CHINESE, k=3))
    for _ in range(300):
        lines.append(
            "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n"
            "<think>\nThe user asks my name.\n</think>\n\nI am {{NAME}}, made by {{AUTHOR}}."
            "<|im_end|>\n"
        )
    return lines


def build_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(MARKUP_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    tokenizer.add_tokens(MARKUP_TOKENS)
    return tokenizer


def build(output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE.read_text()
    fast.save_pretrained(output)
    config = Qwen3Config(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.pad_token_id,
        torch_dtype="float32",
    )
    config.architectures = ["Qwen3ForCausalLM"]
    config.save_pretrained(output)
    # Drop the version stamp so rebuilding with another transformers stays byte-identical.
    config_path = output / "config.json"
    data = json.loads(config_path.read_text())
    data.pop("transformers_version", None)
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT)
