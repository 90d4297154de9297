"""forward_backward(task='embedding') on the bundled tiny Qwen3 (a causal decoder) and on a
tiny random BERT (an encoder loaded with model_cls=AutoModel), written as the documents'
embedding script writes it."""

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig
from transformers import AutoModel, AutoTokenizer, BertConfig

from twinkle.hub import resolve_model
from twinkle.loss import InfonceLoss
from twinkle.metric import EmbeddingMetric
from twinkle.model import TransformersModel
from twinkle.processor import InputProcessor

MODEL_ID = "bundled://tiny-qwen3"
PAIRS = Path(__file__).parent / "data" / "embedding_pairs.jsonl"


@pytest.fixture(scope="module")
def features():
    """Eight (anchor, positive) groups: sixteen texts of uneven lengths, each ending in EOS so
    that the last token, the one pooled, has read the whole text."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL_ID))
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines()][:8]
    out = []
    for row in rows:
        for text, flag in ((row["anchor"], 1), (row["positive"], 0)):
            ids = tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
            out.append({"input_ids": ids, "embedding_label": flag})
    return out


def embedding_model(lora: LoraConfig | None = None, **kwargs) -> TransformersModel:
    """The documents' setup; an adapter comes first, as components belong to it."""
    model = TransformersModel(MODEL_ID, ddp_config={"find_unused_parameters": True}, **kwargs)
    if lora is not None:
        model.add_adapter_to_model("default", lora)
    model.set_processor(InputProcessor)
    model.set_loss(InfonceLoss, temperature=0.1, use_batch=True)
    return model


def test_lora_embedding_training_lowers_the_loss(features):
    model = embedding_model(LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    model.set_optimizer(optimizer_cls="AdamW", lr=3e-3)
    model.add_metric(EmbeddingMetric, is_training=True)
    losses = []
    for step in range(12):
        out = model.forward_backward(inputs=features, task="embedding")
        model.clip_grad_and_step(gradient_accumulation_steps=1)
        losses.append(out.loss)
        if step == 0:
            first = model.calculate_metric(is_training=True)
    last = model.calculate_metric(is_training=True)
    assert losses[-1] < 0.5 * losses[0]
    assert out.embeddings.shape == (16, 64) and out.num_tokens == 8  # normalised by anchors
    assert {"loss", "pos_sim", "neg_sim", "grad_norm", "lr", "tokens"} <= set(last)
    assert last["pos_sim"] > first["pos_sim"] and last["loss"] < first["loss"]
    assert model.calculate_metric(is_training=False) == {}, "training feeds no eval metric"


def test_the_loss_sees_the_pooled_embeddings_and_the_group_labels(features):
    model = embedding_model()
    out = model.forward_only(features, task="embedding")
    labels = torch.tensor([f["embedding_label"] for f in features])
    direct = InfonceLoss(temperature=0.1)({"labels": labels}, {"embeddings": out.embeddings})
    assert out.loss == pytest.approx(float(direct["loss"]) / 8, rel=1e-5)


def test_last_token_pooling_ignores_padding_and_packing(features):
    model = embedding_model()
    alone = torch.stack(
        [
            model.model.model(input_ids=torch.tensor([f["input_ids"]])).last_hidden_state[0, -1]
            for f in features
        ]
    ).detach()
    for processor in (
        InputProcessor(padding_side="right"),
        InputProcessor(padding_side="left"),
        InputProcessor(padding_free=True, pad_to_multiple_of=64),
    ):
        model.set_processor(processor)
        got = model.forward_only(features, task="embedding").embeddings
        torch.testing.assert_close(got, alone, atol=1e-5, rtol=1e-4)


def test_a_collated_batch_carries_its_group_labels(features):
    model = embedding_model()
    batch = InputProcessor()(features)
    batch["labels"] = torch.tensor([f["embedding_label"] for f in features])
    from_batch = model.forward_only(batch, task="embedding")
    from_features = model.forward_only(features, task="embedding")
    assert from_batch.loss == pytest.approx(from_features.loss, rel=1e-6)
    bad = {**batch, "labels": batch["labels"][:-2]}
    with pytest.raises(ValueError, match=r"holds 16 sequences but its group labels have shape"):
        model.forward_only(bad, task="embedding")


def test_inference_needs_no_group_labels(features):
    model = embedding_model(embedding_pooling="mean")
    unlabeled = [{"input_ids": f["input_ids"]} for f in features]
    out = model.forward_only(unlabeled, task="embedding")
    assert out.loss is None and out.embeddings.shape == (16, 64)
    with pytest.raises(ValueError, match="training needs group labels: give each feature"):
        model.forward_backward(unlabeled, task="embedding")


def test_eval_metrics_are_their_own_collection(features):
    model = embedding_model()
    model.add_metric(EmbeddingMetric, is_training=False)
    model.forward_only(features, task="embedding")
    evaluated = model.calculate_metric(is_training=False)
    assert {"loss", "pos_sim", "neg_sim"} <= set(evaluated)
    assert model.calculate_metric(is_training=True) == {}
    assert model.calculate_metric(is_training=False) == {}, "reported metrics reset"


def test_gradient_accumulation_steps_given_to_clip_grad_and_step(features):
    model = embedding_model()
    model.set_optimizer("AdamW", lr=1e-3)
    before = model.model.lm_head.weight.detach().clone()
    model.forward_backward(features, task="embedding")
    assert model.clip_grad_and_step(gradient_accumulation_steps=2) is None
    torch.testing.assert_close(model.model.lm_head.weight, before)
    model.forward_backward(features, task="embedding")
    assert isinstance(model.clip_grad_and_step(gradient_accumulation_steps=2), float)
    assert not torch.equal(model.model.lm_head.weight, before)
    with pytest.raises(ValueError, match="must be a positive integer, got 0"):
        model.clip_grad_and_step(gradient_accumulation_steps=0)


def test_bad_embedding_calls_fail_early(features):
    model = embedding_model()
    with pytest.raises(ValueError, match="unknown task 'classify'; choose one of causal_lm"):
        model.forward_backward(features, task="classify")
    with pytest.raises(ValueError, match="takes no micro_batch_size"):
        model.forward_backward(features, task="embedding", micro_batch_size=4)
    with pytest.raises(ValueError, match="unknown pooling 'max'"):
        TransformersModel(MODEL_ID, embedding_pooling="max")
    with pytest.raises(TypeError, match="ddp_config must be a dict"):
        TransformersModel(MODEL_ID, ddp_config=["find_unused_parameters"])
    assert model.ddp_config == {"find_unused_parameters": True}


def tiny_bert(**kwargs) -> TransformersModel:
    config = BertConfig(
        vocab_size=4000,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return TransformersModel(config=config, model_cls=AutoModel, **kwargs)


def test_an_encoder_trains_as_an_embedding_model(features):
    model = tiny_bert(embedding_pooling="cls")
    model.set_loss(InfonceLoss, temperature=0.1)
    model.set_optimizer("AdamW", lr=3e-3)
    losses = [model.forward_backward(features, task="embedding").loss]
    for _ in range(8):
        model.clip_grad_and_step()
        losses.append(model.forward_backward(features, task="embedding").loss)
    assert type(model.model).__name__ == "BertModel"
    assert losses[-1] < 0.5 * losses[0]


def test_an_encoder_refuses_token_prediction_and_packed_rows(features):
    model = tiny_bert()
    with pytest.raises(ValueError, match="BertModel has no language-model head"):
        model.forward_backward(features)
    model.set_processor(InputProcessor(padding_free=True))
    with pytest.raises(ValueError, match="attends in both directions"):
        model.forward_only(features, task="embedding")
