"""Padding-free training equals padded training: PackingDataset -> InputProcessor(
padding_free=True) -> TransformersModel gives the loss, the gradients and, after a few
AdamW steps, the parameters of the same sequences padded, for a tiny Qwen3 (full
attention) and a tiny Qwen3.5 (GatedDeltaNet linear attention mixed with full attention),
the latter also with LoRA and gradient checkpointing.

Tolerances, float32: losses 1e-5 relative; gradients 1e-5 absolute and relative (measured:
at most 0.18 of that bound). Parameters after 3 AdamW steps at lr 1e-3: every weight within
1e-4 (a tenth of one step) and all but 0.1% within 1e-6. Adam divides each gradient by its
own size, so float32 noise on the smallest gradients (Qwen3.5's decay parameters, |g| ~1e-6
against a median 1.7e-2) moves those few weights by up to ~1% of lr x steps: measured 7.4e-6
at most here, 3.3e-5 reported from a tree whose changes reordered sums; 1e-6 for 99.996% of
the weights. A wrong gradient moves most weights, by up to lr a step: one label dropped from
one step's batch moved 52% of them beyond 1e-6, the largest by 2.8e-3.
Unpatched, the Qwen3.5 packed loss differs.
"""

import re
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from peft import LoraConfig
from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta, PackingDataset
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.processor import InputProcessor

MODEL_ID = "bundled://tiny-qwen3"
STEPS = 3
LOSS_TOL = {"atol": 0.0, "rtol": 1e-5}
GRAD_TOL = {"atol": 1e-5, "rtol": 1e-5}
PARAM_TOL = {"atol": 1e-4, "rtol": 0.0}
BULK_TOL, BULK_SHARE = 1e-6, 1e-3  # all but BULK_SHARE of the weights within BULK_TOL


@pytest.fixture(scope="module", autouse=True)
def datasets_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf")))
        yield


def encoded_dataset(rows: int = 24) -> Dataset:
    dataset = Dataset(DatasetMeta("bundled://self-cognition", data_slice=range(rows)))
    dataset.set_template("Qwen3_5Template", model_id=MODEL_ID, max_length=512)
    dataset.map(SelfCognitionProcessor("Twinkle", "the Twinkle team"))
    dataset.encode()
    return dataset


@pytest.fixture(scope="module")
def packed_batches():
    """Two global batches of packed rows (several conversations each) from PackingDataset."""
    packed = PackingDataset(dataset=encoded_dataset(), max_length=160, seed=0)
    batches = list(DataLoader(packed, batch_size=2))[:2]
    assert all(len(row["seq_lens"]) > 1 for batch in batches for row in batch)
    return batches


def unpack(batch: list) -> list[dict]:
    """The conversations inside packed rows, as unpadded features of their own."""
    features = []
    for row in batch:
        start = 0
        for length in row["seq_lens"]:
            end = start + length
            features.append(
                {"input_ids": row["input_ids"][start:end], "labels": row["labels"][start:end]}
            )
            start = end
    return features


def qwen3_5_config() -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(
        vocab_size=3909,
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
        linear_conv_kernel_dim=4,
        pad_token_id=0,
        tie_word_embeddings=True,
    )


def qwen3_5_lora_checkpointed() -> TransformersModel:
    """LoRA wraps the projections inside the patched layers; checkpointing re-runs them."""
    model = TransformersModel(config=qwen3_5_config(), gradient_checkpointing=True)
    torch.manual_seed(0)  # peft draws LoRA A from the global generator: same on both sides
    model.add_adapter_to_model("default", LoraConfig(r=4, target_modules="all-linear"))
    return model


MODELS = {
    "qwen3": lambda: TransformersModel(MODEL_ID),
    "qwen3_5_text": lambda: TransformersModel(config=qwen3_5_config()),
    "qwen3_5_text_lora_checkpointing": qwen3_5_lora_checkpointed,
}


def train(make_model, batches, padding_free: bool):
    """Losses, first-step gradients and final parameters of STEPS optimizer steps."""
    model = make_model()
    model.set_processor(InputProcessor, padding_free=padding_free)
    model.set_optimizer("AdamW", lr=1e-3)
    losses, first_grads = [], None
    for step in range(STEPS):
        batch = batches[step % len(batches)]
        losses.append(model.forward_backward(batch if padding_free else unpack(batch)).loss)
        if first_grads is None:
            first_grads = {
                n: p.grad.clone() for n, p in model.model.named_parameters() if p.grad is not None
            }
        model.clip_grad_and_step(max_grad_norm=1e9)
    params = {n: p.detach().clone() for n, p in model.model.named_parameters()}
    return model, losses, first_grads, params


@pytest.mark.parametrize("family", MODELS)
def test_packed_training_equals_padded_training(family, packed_batches):
    model, packed_losses, packed_grads, packed_params = train(
        MODELS[family], packed_batches, padding_free=True
    )
    _, padded_losses, padded_grads, padded_params = train(
        MODELS[family], packed_batches, padding_free=False
    )
    torch.testing.assert_close(packed_losses, padded_losses, **LOSS_TOL)
    for name, grad in padded_grads.items():
        torch.testing.assert_close(packed_grads[name], grad, **GRAD_TOL, msg=name)
    for name, param in padded_params.items():
        torch.testing.assert_close(packed_params[name], param, **PARAM_TOL, msg=name)
    diffs = torch.cat([(packed_params[n] - p).abs().flatten() for n, p in padded_params.items()])
    assert float((diffs > BULK_TOL).double().mean()) < BULK_SHARE, diffs.topk(10).values
    patched = getattr(model._hf_model(), "_twinkle_patches", frozenset())
    assert ("GatedDeltaNetPaddingFreePatch" in patched) == family.startswith("qwen3_5")
    assert packed_grads.keys() == padded_grads.keys() and packed_grads


def test_without_the_patch_qwen3_5_packed_loss_is_wrong(packed_batches):
    """The reason the patch exists: transformers' linear attention leaks across sequences."""
    torch.manual_seed(0)
    hf_model = AutoModelForCausalLM.from_config(qwen3_5_config())
    batch = InputProcessor(padding_free=True)(packed_batches[0])
    padded = InputProcessor()(unpack(packed_batches[0]))
    inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    packed_logits = hf_model(**inputs, use_cache=False).logits[0]
    padded_logits = hf_model(
        padded["input_ids"], attention_mask=padded["attention_mask"], use_cache=False
    ).logits
    mask = padded["attention_mask"].bool()
    assert (packed_logits - padded_logits[mask]).abs().max() > 1e-3


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_full_attention_separates_packed_sequences_by_position_ids(implementation):
    """transformers builds a block-diagonal causal mask from restarting position_ids (with
    no cache and no attention mask), for sdpa and eager alike: no varlen kernel needed."""
    model = TransformersModel(MODEL_ID).model
    model.set_attn_implementation(implementation)
    assert model.config._attn_implementation == implementation
    sequences = [torch.arange(1, 8), torch.arange(20, 23), torch.arange(40, 52)]
    ids = torch.cat(sequences).view(1, -1)
    positions = torch.cat([torch.arange(s.numel()) for s in sequences]).view(1, -1)
    packed = model(ids, position_ids=positions, use_cache=False).logits
    alone = torch.cat([model(s.view(1, -1), use_cache=False).logits for s in sequences], 1)
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)


def test_packing_a_sample_longer_than_max_length_is_a_clear_error():
    with pytest.raises(ValueError, match=r"longer than max_length=16 .*truncation_strategy"):
        PackingDataset(dataset=encoded_dataset(rows=4), max_length=16)


def test_the_padding_free_cookbook_runs(tmp_path):
    script = Path(__file__).resolve().parents[3] / "cookbook" / "padding_free.py"
    done = subprocess.run(
        [sys.executable, str(script), "--qwen3_5", "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    pattern = r"step \d: (\d+) conversations in 2 packed rows.*loss ([0-9.]+)"
    steps = re.findall(pattern, done.stderr)
    assert len(steps) == 2 and all(int(n) > 2 for n, _ in steps), done.stderr[-3000:]
