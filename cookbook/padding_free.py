"""Padding-free training: the documents' PackingDataset example, continued into the loop.

PackingDataset bin-packs the encoded conversations into rows of at most ``max_length``
tokens, ``position_ids`` restarting at 0 for each conversation. ``InputProcessor(
padding_free=True)`` concatenates a batch's rows into one row with the cumulative
sequence lengths (``cu_seq_lens_q``) that varlen kernels take, and the model trains on it
with no padding token anywhere. The loss and gradients are those of the same
conversations padded (packages/twinkle-models/tests/test_padding_free.py checks it).

Full attention keeps the conversations apart by their ``position_ids`` (use_cache is off
in training). A Qwen3.5 / Qwen3-Next model, whose GatedDeltaNet linear attention carries
a state along the row, gets ``GatedDeltaNetPaddingFreePatch`` the first time a packed
batch reaches it: the state then restarts at every conversation (twinkle-kernels' varlen
torch reference on a CPU, flash-linear-attention's kernels on a GPU when installed).
Pass ``--qwen3_5`` to train a tiny random Qwen3.5 that way.

``ms://swift/self-cognition`` and ``ms://Qwen/Qwen3.5-4B`` became the bundled ids.

    python cookbook/padding_free.py [--qwen3_5] [--steps 10]
"""

import argparse

from transformers import AutoConfig, Qwen3_5TextConfig

from twinkle import get_logger
from twinkle.dataloader import DataLoader
from twinkle.dataset import DatasetMeta, PackingDataset
from twinkle.hub import resolve_model
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.processor import InputProcessor

logger = get_logger()
MODEL_ID = "bundled://tiny-qwen3"


def tiny_qwen3_5() -> TransformersModel:
    """A random 4-layer Qwen3.5 text model: linear attention, full attention, twice."""
    vocab = AutoConfig.from_pretrained(resolve_model(MODEL_ID)).vocab_size
    config = Qwen3_5TextConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        layer_types=["linear_attention", "full_attention"] * 2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    return TransformersModel(config=config)


def train(qwen3_5: bool, steps: int) -> None:
    dataset = PackingDataset(DatasetMeta("bundled://self-cognition"))
    dataset.map(SelfCognitionProcessor(model_name="Twinkle模型", model_author="ModelScope社区"))
    dataset.set_template("Qwen3_5Template", model_id=MODEL_ID, max_length=512)
    dataset.encode()
    dataset.pack_dataset()
    dataloader = DataLoader(dataset, batch_size=2)

    model = tiny_qwen3_5() if qwen3_5 else TransformersModel(model_id=MODEL_ID)
    model.set_processor(InputProcessor, padding_free=True)
    model.set_optimizer("AdamW", lr=1e-3)
    for step, batch in enumerate(dataloader):
        if step == steps:
            break
        output = model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
        conversations = sum(len(row["seq_lens"]) for row in batch)
        logger.info(
            f"step {step}: {conversations} conversations in {len(batch)} packed rows, "
            f"{int(output.num_tokens)} label tokens, loss {output.loss:.4f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Padding-free training on packed rows")
    parser.add_argument("--qwen3_5", action="store_true", help="a tiny Qwen3.5 (linear attention)")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    train(args.qwen3_5, args.steps)
