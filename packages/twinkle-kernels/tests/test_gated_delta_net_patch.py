"""GatedDeltaNetPaddingFreePatch: a tiny Qwen3.5 (and Qwen3-Next) on a packed row gives the
logits and gradients of each sequence run alone (tolerance 1e-5, float32); unpatched, it
does not. The patch is idempotent and applies only where it should."""

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3_5TextConfig, Qwen3Config, Qwen3NextConfig

from twinkle.patch import PATCHES, GatedDeltaNetPaddingFreePatch, apply_for_batch, is_packed_batch

TOL = {"atol": 1e-5, "rtol": 1e-5}
LENGTHS = [5, 1, 17, 9]
SMALL = {
    "vocab_size": 97,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "pad_token_id": 0,
}


def build(config_cls, **extra):
    torch.manual_seed(0)
    config = config_cls(
        **SMALL,
        num_hidden_layers=3,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        **extra,
    )
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module")
def sequences():
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(1, 97, (n,), generator=generator) for n in LENGTHS]


def packed(sequences):
    ids = torch.cat(sequences).view(1, -1)
    positions = torch.cat([torch.arange(s.numel()) for s in sequences]).view(1, -1)
    return ids, positions


def alone(model, sequences):
    return torch.cat([model(s.view(1, -1), use_cache=False).logits for s in sequences], 1)


MODELS = {
    "qwen3_5_text": lambda: build(Qwen3_5TextConfig),
    "qwen3_next": lambda: build(
        Qwen3NextConfig,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        decoder_sparse_step=2,
    ),
}


@pytest.mark.parametrize("family", MODELS)
def test_packed_logits_and_gradients_equal_each_sequence_alone(family, sequences):
    model = MODELS[family]()
    ids, positions = packed(sequences)
    reference = alone(model, sequences)
    leaky = model(ids, position_ids=positions, use_cache=False).logits
    assert (leaky - reference).abs().max() > 1e-3, "unpatched, packed sequences leak"

    assert apply_for_batch(model, {"input_ids": ids, "position_ids": positions}) == [
        "GatedDeltaNetPaddingFreePatch"
    ]
    logits = model(ids, position_ids=positions, use_cache=False).logits
    torch.testing.assert_close(logits, reference, **TOL)

    probe = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2))
    params = [p for p in model.parameters() if p.requires_grad]
    ours = torch.autograd.grad((logits * probe).sum(), params, allow_unused=True)
    theirs = torch.autograd.grad((alone(model, sequences) * probe).sum(), params, allow_unused=True)
    for (name, _), a, b in zip(model.named_parameters(), ours, theirs, strict=True):
        if b is None:
            assert a is None, name
        else:
            torch.testing.assert_close(a, b, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_cu_seq_lens_given_with_the_batch_are_used(sequences):
    model = build(Qwen3_5TextConfig)
    GatedDeltaNetPaddingFreePatch().apply(model)
    ids, positions = packed(sequences)
    cu_seqlens = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    logits = model(ids, position_ids=positions, cu_seq_lens_q=cu_seqlens, use_cache=False).logits
    torch.testing.assert_close(logits, alone(model, sequences), **TOL)


def test_unpacked_inputs_run_the_layers_own_forward(sequences):
    model = build(Qwen3_5TextConfig)
    batch = sequences[2].view(1, -1)
    before = model(batch, use_cache=False).logits
    GatedDeltaNetPaddingFreePatch().apply(model)
    assert torch.equal(model(batch, use_cache=False).logits, before)
    cached = model(batch, use_cache=True)  # generation keeps working
    assert cached.past_key_values is not None


def test_apply_is_idempotent_and_applies_only_to_linear_attention_models(sequences):
    model = build(Qwen3_5TextConfig)
    patch = GatedDeltaNetPaddingFreePatch()
    layer = model.model.layers[0]
    assert patch.apply(model) is True
    forward = layer.linear_attn.forward
    assert patch.apply(model) is False and layer.linear_attn.forward is forward
    ids, positions = packed(sequences)
    assert apply_for_batch(model, {"input_ids": ids, "position_ids": positions}) == []

    torch.manual_seed(0)
    dense = AutoModelForCausalLM.from_config(
        Qwen3Config(
            **{k: v for k, v in SMALL.items() if not k.startswith("linear")}, num_hidden_layers=1
        )
    )
    assert not patch.applies_to(dense)
    with pytest.raises(ValueError, match="does not apply to Qwen3ForCausalLM"):
        patch.apply(dense)
    assert apply_for_batch(dense, {"input_ids": ids, "position_ids": positions}) == []
    assert PATCHES.get("GatedDeltaNetPaddingFreePatch") is GatedDeltaNetPaddingFreePatch


def test_packed_rows_with_a_cache_are_refused(sequences):
    model = build(Qwen3_5TextConfig)
    GatedDeltaNetPaddingFreePatch().apply(model)
    ids, positions = packed(sequences)
    with pytest.raises(ValueError, match="use_cache=False"):
        model(ids, position_ids=positions, use_cache=True)


def test_is_packed_batch():
    assert is_packed_batch({"cu_seq_lens_q": torch.tensor([0, 3])})
    assert is_packed_batch({"position_ids": torch.tensor([[0, 1, 0, 1, 2]])})
    assert not is_packed_batch({"position_ids": torch.tensor([[0, 1, 2]])})
    # A right-padded batch of several rows restarts positions at 0 on padding: not packed.
    assert not is_packed_batch({"position_ids": torch.tensor([[0, 1, 2], [0, 1, 0]])})
