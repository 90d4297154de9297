"""Padding-free by default: the documents' loop (no set_processor) runs a skewed batch's
forward as one packed row on every model family whose attention keeps packed sequences
apart, and the loss, gradients, metrics and forward_only outputs per sequence equal those
of the same batch padded (``padding_free=False``). Also: the choice is logged once; rows
of one length and single sequences stay padded (nothing to gain); a model that cannot
pack pads by default and, forced, is a clear error naming its attention.

Families: a tiny random model of each transformers family we train (built from its config,
as the hub is out of reach), plus every model bundled with twinkle (``bundled://``), so
the families bundled later are covered without editing this file.
Tolerances, float32: losses 1e-5 relative; gradients and logps 2e-5 absolute.
"""

from __future__ import annotations

import logging

import pytest
import torch
import transformers
from transformers import AttentionInterface, AttentionMaskInterface, AutoConfig
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from twinkle.hub import resolve_model
from twinkle.hub.bundled import bundled_names
from twinkle.model import TransformersModel
from twinkle.model.transformers import packing
from twinkle.model.transformers.packing import ForwardCost
from twinkle.model.transformers.strategy.ring_attention import RING_ATTENTION
from twinkle.processor import InputProcessor

VOCAB = 256
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    pad_token_id=0,
)
LINEAR = dict(
    layer_types=["linear_attention", "full_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
CONFIGS = {
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {}),
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {}),
    "glm4": ("Glm4Config", {}),
    "gemma3_text": ("Gemma3TextConfig", {"sliding_window": 4}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {**MOE, "output_router_logits": True, "router_aux_loss_coef": 0.1},
    ),
    "qwen3_5_text": ("Qwen3_5TextConfig", LINEAR),
    "qwen3_5_moe_text": (
        "Qwen3_5MoeTextConfig",
        {**LINEAR, **MOE, "shared_expert_intermediate_size": 16},
    ),
    "qwen3_next": (
        "Qwen3NextConfig",
        {**LINEAR, **MOE, "shared_expert_intermediate_size": 16, "decoder_sparse_step": 1},
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        {
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "n_shared_experts": 1,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "kv_lora_rank": 8,
            "q_lora_rank": 16,
            "qk_rope_head_dim": 4,
            "head_dim": 4,
            "num_key_value_heads": 4,
            "qk_nope_head_dim": 4,
            "v_head_dim": 8,
        },
    ),
}
BUNDLED = bundled_names("model")


def build(family: str, processor: bool | None) -> TransformersModel:
    if family in CONFIGS:
        name, extra = CONFIGS[family]
        model = TransformersModel(config=getattr(transformers, name)(**{**SMALL, **extra}))
    else:
        model = TransformersModel(f"bundled://{family}")
    if processor is not None:
        model.set_processor(InputProcessor, padding_free=processor)
    model.set_optimizer("AdamW", lr=1e-3)
    return model


def vocab_of(family: str) -> int:
    if family in CONFIGS:
        return VOCAB
    config = AutoConfig.from_pretrained(resolve_model(f"bundled://{family}"))
    return config.get_text_config().vocab_size


def skewed(vocab: int, lengths=(3, 17, 5, 2, 11)) -> list[dict]:
    generator = torch.Generator().manual_seed(1)
    rows = []
    for n in lengths:
        ids = torch.randint(1, vocab, (n,), generator=generator).tolist()
        rows.append({"input_ids": ids, "labels": ids})
    return rows


class RowsSeen:
    """The batch shapes the embedding layer sees: (1, N) when a forward ran packed."""

    def __init__(self, model: TransformersModel) -> None:
        self.shapes: list[tuple[int, ...]] = []
        embeddings = model._hf_model().get_input_embeddings()
        embeddings.register_forward_hook(lambda m, args, out: self.shapes.append(args[0].shape))


def run(family: str, processor: bool | None, batch: list[dict]) -> dict:
    model = build(family, processor)
    seen = RowsSeen(model)
    trained = model.forward_backward(inputs=batch)
    grads = {n: p.grad.clone() for n, p in model.model.named_parameters() if p.grad is not None}
    model.clip_grad_and_step(max_grad_norm=1e9)
    metrics = model.calculate_metric(is_training=True)
    evaluated = model.forward_only(inputs=batch)
    return {
        "trained": trained,
        "grads": grads,
        "metrics": {
            k: v for k, v in metrics.items() if k not in ("step_time", "tokens_per_second")
        },
        "evaluated": evaluated,
        "shapes": seen.shapes,
    }


@pytest.mark.parametrize("family", [*CONFIGS, *BUNDLED])
def test_the_default_packs_and_equals_padding(family):
    batch = skewed(vocab_of(family))
    auto, padded = run(family, None, batch), run(family, False, batch)
    assert auto["shapes"][0] == (1, sum(len(row["input_ids"]) for row in batch)), auto["shapes"]
    assert padded["shapes"][0] == (len(batch), 17)
    for key in ("trained", "evaluated"):
        a, p = auto[key], padded[key]
        torch.testing.assert_close(a.loss, p.loss, atol=0.0, rtol=1e-5)
        assert a.logps.shape == p.logps.shape == (len(batch), 17)
        torch.testing.assert_close(a.logps, p.logps, atol=2e-5, rtol=0.0)
        assert a.num_tokens == p.num_tokens
    assert auto["grads"].keys() == padded["grads"].keys() and auto["grads"]
    for name, grad in padded["grads"].items():
        torch.testing.assert_close(auto["grads"][name], grad, atol=2e-5, rtol=1e-4, msg=name)
    assert auto["metrics"].keys() == padded["metrics"].keys()
    for name, value in padded["metrics"].items():
        assert auto["metrics"][name] == pytest.approx(value, rel=1e-5, abs=1e-7), name


def test_lora_with_checkpointing_and_left_padding_pack_too():
    from peft import LoraConfig

    batch = skewed(vocab_of("tiny-qwen3"))
    results = []
    for processor in (None, False):
        model = TransformersModel("bundled://tiny-qwen3", gradient_checkpointing=True)
        torch.manual_seed(0)
        model.add_adapter_to_model("default", LoraConfig(r=4, target_modules="all-linear"))
        model.set_processor(InputProcessor, padding_side="left", padding_free=processor)
        seen = RowsSeen(model)
        out = model.forward_backward(inputs=batch)
        grads = [p.grad.clone() for p in model.model.parameters() if p.grad is not None]
        results.append((out, grads, seen.shapes[0]))
    (auto, auto_grads, auto_shape), (padded, padded_grads, padded_shape) = results
    assert auto_shape[0] == 1 and padded_shape[0] == len(batch)
    torch.testing.assert_close(auto.loss, padded.loss, atol=0.0, rtol=1e-5)
    torch.testing.assert_close(auto.logps, padded.logps, atol=2e-5, rtol=0.0)
    for mine, reference in zip(auto_grads, padded_grads, strict=True):
        torch.testing.assert_close(mine, reference, atol=2e-5, rtol=1e-4)


def test_the_choice_is_logged_once(caplog):
    model = build("qwen3", None)
    with caplog.at_level(logging.INFO, logger="twinkle.model"):
        for _ in range(2):
            model.forward_backward(inputs=skewed(VOCAB))
    lines = [r.getMessage() for r in caplog.records if "padding-free by default" in r.getMessage()]
    assert len(lines) == 1 and "attention 'sdpa'" in lines[0]


def test_the_logged_advice_runs_as_written_with_the_processor_by_name():
    """The log line and the refusal say set_processor('InputProcessor', padding_free=False):
    a registered name works locally as over the client (it was stored as a string)."""
    model = build("qwen3", None)
    model.set_processor("InputProcessor", padding_free=False)
    seen = RowsSeen(model)
    model.forward_backward(inputs=skewed(VOCAB))
    assert seen.shapes == [(5, 17)]
    with pytest.raises(ValueError, match=r"unknown input processor 'InputProcesor'; known: "):
        model.set_processor("InputProcesor")


@pytest.mark.parametrize(
    "lengths", [(9, 9, 9, 9), (12,)], ids=["uniform lengths", "single sequence"]
)
def test_rows_without_padding_run_padded(lengths):
    model = build("qwen3", None)
    seen = RowsSeen(model)
    model.forward_backward(inputs=skewed(VOCAB, lengths))
    assert seen.shapes == [(len(lengths), lengths[0])]


def test_the_cost_estimate_packs_padding_away_but_not_a_long_dense_row():
    cost = ForwardCost(per_token=1000.0, per_pair=10.0, varlen=False)
    assert cost.saves([10, 60, 5, 20], 60)  # linear layers dominate: padding is waste
    assert not cost.saves([60, 60], 60)  # no padding: never
    # Long rows: a dense mask over the whole 5,200-token packed row costs more than the
    # padding saves; a varlen attention (flash) attends within each sequence only.
    lengths = [1000] * 4 + [300] * 4
    assert not cost.saves(lengths, 1000)
    assert ForwardCost(per_token=1000.0, per_pair=10.0, varlen=True).saves(lengths, 1000)


@pytest.mark.parametrize(
    ("attention", "flash_blocks", "varlen"),
    [
        ("sdpa", True, False),
        ("flash_attention_2", False, True),
        (RING_ATTENTION, False, False),  # a CPU: every pair of a block, masked
        (RING_ATTENTION, True, True),  # flash-attention's varlen blocks
    ],
)
def test_the_cost_estimate_knows_which_attention_skips_across_sequences(
    attention, flash_blocks, varlen, monkeypatch
):
    hf = build("qwen3", None).model
    hf.config._attn_implementation = attention
    monkeypatch.setattr(packing, "has_flash_blocks", lambda device: flash_blocks)
    assert ForwardCost.of(hf).varlen is varlen


@pytest.fixture
def unknown_attention():
    """An attention implementation twinkle does not know (a user's kernel): sdpa inside."""
    AttentionInterface.register("users_kernel", sdpa_attention_forward)
    AttentionMaskInterface.register("users_kernel", sdpa_mask)
    return "users_kernel"


def test_a_model_that_cannot_pack_pads_by_default_and_refuses_being_forced(unknown_attention):
    config = transformers.Qwen3Config(**SMALL)
    config._attn_implementation = unknown_attention
    model = TransformersModel(config=config)
    seen = RowsSeen(model)
    model.forward_backward(inputs=skewed(VOCAB))
    assert seen.shapes == [(5, 17)]
    model.set_processor(InputProcessor, padding_free=True)
    with pytest.raises(ValueError, match=r"attention 'users_kernel'.*padding_free=False"):
        model.forward_backward(inputs=skewed(VOCAB))


def test_a_model_with_a_causal_convolution_cannot_pack():
    without_head_dim = {key: value for key, value in SMALL.items() if key != "head_dim"}
    config = transformers.Lfm2Config(**without_head_dim, layer_types=["conv", "full_attention"])
    model = TransformersModel(config=config)
    seen = RowsSeen(model)
    model.forward_backward(inputs=skewed(VOCAB))
    assert seen.shapes[0][0] == 5
    model.set_processor(InputProcessor, padding_free=True)
    with pytest.raises(
        ValueError, match=r"attention 'sdpa'\) has layers that carry state along the row \(Conv1d"
    ):
        model.forward_backward(inputs=skewed(VOCAB))


def test_packed_rows_from_a_packing_dataset_train_without_setting_a_processor():
    """The documents' padding-free section: PackingDataset rows go straight to the model."""
    rows = skewed(VOCAB)
    packed = [
        {
            "input_ids": rows[0]["input_ids"] + rows[1]["input_ids"],
            "labels": rows[0]["labels"] + rows[1]["labels"],
            "position_ids": list(range(3)) + list(range(17)),
        },
        rows[2],
    ]
    default, forced = build("qwen3", None), build("qwen3", True)
    torch.testing.assert_close(
        default.forward_backward(inputs=packed).loss,
        forced.forward_backward(inputs=packed).loss,
        atol=0.0,
        rtol=0.0,
    )
    unpacked = run("qwen3", False, rows[:3])["trained"]
    torch.testing.assert_close(
        default.forward_backward(inputs=packed).loss, unpacked.loss, atol=0.0, rtol=1e-5
    )
