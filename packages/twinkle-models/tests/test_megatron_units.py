"""MegatronModel's pieces that need no process group: layout checks, config, weight layouts.

The bad meshes of the issue (tp not dividing the heads or kv heads, more stages than
layers, ep on a dense model) fail here, before any process group or megatron-core
import, with the number that is wrong. The shard layouts are checked for an exact
round trip at several tensor-parallel sizes; that they are the layouts Megatron
computes with is shown by the logits equivalence in test_megatron_parallel.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig

from twinkle import DeviceMesh
from twinkle.hub import resolve_model
from twinkle.model.families.base import GPT_LAYER_WEIGHTS
from twinkle.model.megatron.config import gpt_spec
from twinkle.model.megatron.convert import from_shards, hf_names_of, to_shard
from twinkle.model.megatron.layout import MegatronLayout
from twinkle.model.megatron.lora import PROJECTIONS, LoraSettings, projections_of
from twinkle.model.megatron.optimizer import optimizer_name


@pytest.fixture(scope="module")
def qwen3():
    return AutoConfig.from_pretrained(resolve_model("bundled://tiny-qwen3"))


def _layout(**sizes) -> MegatronLayout:
    return MegatronLayout.from_mesh(DeviceMesh.from_sizes(device_type="cpu", **sizes))


def test_mesh_maps_onto_megatron_sizes():
    layout = _layout(dp_size=2, fsdp_size=2, pp_size=2, tp_size=2, vpp_size=2)
    assert (layout.tp, layout.pp, layout.vpp, layout.dp, layout.world_size) == (2, 2, 2, 4, 16)
    assert MegatronLayout.from_mesh(None).world_size == 1


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({"tp_size": 3}, "tp_size=3 does not divide the model's 4 attention heads"),
        ({"tp_size": 4}, "tp_size=4 does not divide the model's 2 key/value heads"),
        ({"pp_size": 4}, "4 pipeline stages but the model has only 2 layers"),
        ({"pp_size": 2, "vpp_size": 2}, "4 pipeline stages but the model has only 2 layers"),
        ({"dp_size": 2, "ep_size": 2}, "needs a mixture-of-experts model; qwen3 is dense"),
        ({"sequence_parallel": True}, "needs tp_size >= 2"),  # the DeviceMesh refuses it
        ({"dp_size": 2, "etp_size": 2}, "etp_size=2 needs a mixture-of-experts model"),
    ],
)
def test_impossible_layouts_fail_with_the_reason(qwen3, sizes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _layout(**sizes).check_model(qwen3)


def _moe(qwen3, **overrides):
    from transformers import Qwen3MoeConfig

    base = {k: v for k, v in qwen3.to_dict().items() if k not in ("model_type", "architectures")}
    base.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
    return Qwen3MoeConfig(**{**base, **overrides})


def test_moe_layouts_and_routing(qwen3):
    moe = _moe(qwen3)
    _layout(dp_size=2, ep_size=2).check_model(moe)
    with pytest.raises(ValueError, match="ep_size=8 does not divide the model's 4 experts"):
        _layout(dp_size=8, ep_size=8).check_model(moe)
    _layout(dp_size=4, ep_size=2, etp_size=2).check_model(moe)
    _layout(tp_size=2, dp_size=2, ep_size=2, sequence_parallel=True).check_model(moe)
    with pytest.raises(ValueError, match="etp_size=3 does not divide the experts' width 32"):
        _layout(dp_size=3, etp_size=3).check_model(moe)
    with pytest.raises(ValueError, match="ep_size × etp_size = 8 must divide"):  # the mesh's
        _layout(dp_size=4, ep_size=2, etp_size=4).check_model(moe)
    with pytest.raises(ValueError, match="requires sequence parallel then; pass sequence_parallel"):
        _layout(tp_size=2, dp_size=2, ep_size=2).check_model(moe)
    assert _layout(tp_size=2, sequence_parallel=True).expert_tp == 2  # etp follows tp
    spec = gpt_spec(moe, tp=1)
    assert (spec.num_experts, spec.topk, spec.moe_ffn_hidden_size, spec.qk_norm) == (4, 2, 32, True)
    assert spec.pre_softmax is False  # top-k renormalised: Megatron's softmax over the top-k
    assert gpt_spec(_moe(qwen3, norm_topk_prob=False), tp=1).pre_softmax is True
    with pytest.raises(ValueError, match="decoder_sparse_step=1"):
        gpt_spec(_moe(qwen3, decoder_sparse_step=2), tp=1)


def test_context_parallel_is_accepted_and_counted_in_the_world(qwen3):
    layout = _layout(cp_size=2, tp_size=2, dp_size=2)
    layout.check_model(qwen3)  # no longer refused: our own attention runs it (no TE)
    assert (layout.cp, layout.world_size) == (2, 8)


def test_ulysses_is_refused_with_the_megatron_alternative():
    with pytest.raises(ValueError, match="use cp_size"):
        _layout(dp_size=2, ulysses_size=2)


def test_layers_must_split_evenly_over_stages(qwen3):
    layers = {"num_hidden_layers": 3, "layer_types": ["full_attention"] * 3}
    config = qwen3.__class__.from_dict({**qwen3.to_dict(), **layers})
    with pytest.raises(ValueError, match="3 layers do not split evenly"):
        _layout(pp_size=2).check_model(config)


def test_config_refuses_what_would_change_the_maths(qwen3):
    spec = gpt_spec(qwen3, tp=2)
    assert (spec.padded_vocab_size, spec.qk_norm, spec.tie_embeddings) == (3910, True, True)
    scaled = qwen3.__class__.from_dict(qwen3.to_dict())
    scaled.rope_parameters = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        gpt_spec(scaled, tp=1)
    other = qwen3.__class__.from_dict(qwen3.to_dict())
    other.model_type = "gemma"
    with pytest.raises(ValueError, match="'gemma' is not one of them"):
        gpt_spec(other, tp=1)


def _bundled(name: str):
    return AutoConfig.from_pretrained(resolve_model(f"bundled://{name}"))


@pytest.mark.parametrize(
    ("name", "lacking"),
    [
        (
            "tiny-gemma3",
            ("post_feedforward_layernorm", "two rope_theta", "sqrt(hidden_size)"),
        ),
        ("tiny-qwen3.5", ("Gated DeltaNet", "flash-linear-attention's Triton kernels")),
        ("tiny-qwen3.5-moe", ("Gated DeltaNet", "refuses sequence parallel")),
    ],
)
def test_families_megatron_core_cannot_express_are_refused_naming_what_it_lacks(name, lacking):
    with pytest.raises(ValueError, match="MegatronModel does not convert") as refused:
        gpt_spec(_bundled(name), tp=1)
    message = str(refused.value)
    assert all(feature in message for feature in lacking)
    assert re.search(r"converts the .*llama.*mistral.*phi3.*qwen3_moe", message)
    assert "with TransformersModel" in message


def test_windows_and_rotary_shares_megatron_cannot_compute_are_refused():
    mistral = _bundled("tiny-mistral")
    assert gpt_spec(mistral, tp=2).rotary_percent == 1.0
    windowed = mistral.__class__.from_dict({**mistral.to_dict(), "sliding_window": 4096})
    with pytest.raises(ValueError, match="sliding-window attention .sliding_window=4096"):
        gpt_spec(windowed, tp=1)
    phi = _bundled("tiny-phi4")  # head_dim 16
    partial = phi.__class__.from_dict(phi.to_dict())
    partial.rope_parameters = {**phi.rope_parameters, "partial_rotary_factor": 0.75}
    assert gpt_spec(partial, tp=1).rotary_percent == 0.75  # 12 of 16 dimensions
    partial.rope_parameters = {**phi.rope_parameters, "partial_rotary_factor": 0.3}
    with pytest.raises(ValueError, match="rotates 4.8 of the 16 dimensions"):
        gpt_spec(partial, tp=1)


def test_sigmoid_routing_reads_as_megatrons_router_or_is_refused():
    glm = _bundled("tiny-glm4.5")  # first layer dense, 4 experts top-2, one shared expert
    spec = gpt_spec(glm, tp=1)
    assert (spec.score_function, spec.expert_bias, spec.moe_layers) == ("sigmoid", True, (0, 1))
    assert (spec.num_experts, spec.topk, spec.shared_ffn_hidden_size) == (4, 2, 32)
    assert (spec.num_groups, spec.rotary_percent, spec.qk_norm) == (0, 0.5, False)
    assert spec.lora_refused is None  # attention, experts and router, as peft adapts them
    assert gpt_spec(_bundled("tiny-deepseek-v3"), tp=1).lora_refused is None
    assert gpt_spec(_with(glm, use_qk_norm=True), tp=1).qk_norm is True
    with pytest.raises(ValueError, match="renormalises sigmoid top-k weights exactly when k > 1"):
        gpt_spec(_with(glm, norm_topk_prob=False), tp=1)
    grouped = _with(glm, n_group=2, topk_group=1)  # a group scored by its top 2 in both
    assert (gpt_spec(grouped, tp=1).num_groups, gpt_spec(grouped, tp=1).group_topk) == (2, 1)
    with pytest.raises(ValueError, match="transformers scores a group by its top 2 experts"):
        gpt_spec(_with(glm, n_group=2, topk_group=2), tp=1)


def test_latent_attention_reads_as_megatrons_and_refuses_context_parallel():
    from twinkle.model.megatron.config import transformer_config

    deepseek = _bundled("tiny-deepseek-v3")
    spec = gpt_spec(deepseek, tp=1)
    assert spec.mla == {
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_head_dim": 8,
        "qk_pos_emb_head_dim": 8,
        "v_head_dim": 16,
    }
    assert (spec.num_groups, spec.group_topk, spec.scaling_factor) == (2, 1, 2.5)
    assert spec.weights["self_attention.linear_kv_down_proj.weight"] == (
        "column",
        ("self_attn.kv_a_proj_with_mqa.weight",),
    )
    with pytest.raises(ValueError, match="cp_size > 1 with multi-head latent attention"):
        transformer_config(spec, _layout(cp_size=2), "fp32", on_accelerator=False)
    with pytest.raises(ValueError, match="always reads the rope dimensions interleaved"):
        gpt_spec(_with(deepseek, rope_interleave=False), tp=1)
    with pytest.raises(ValueError, match="rms_norm_eps=1e-05: transformers normalises"):
        gpt_spec(_with(deepseek, rms_norm_eps=1e-5), tp=1)


def _with(config, **changes):
    return config.__class__.from_dict({**config.to_dict(), **changes})


@pytest.mark.parametrize("tp", [1, 2])
def test_fused_projections_round_trip_and_split_as_the_separate_ones(tp):
    spec = gpt_spec(_bundled("tiny-phi4"), tp)
    assert spec.weights["self_attention.linear_qkv.weight"] == (
        "qkv_fused",
        ("self_attn.qkv_proj.weight",),
    )
    generator = torch.Generator().manual_seed(0)
    d, h = spec.head_dim, spec.hidden_size
    qkv = torch.randn((spec.num_heads + 2 * spec.num_kv_heads) * d, h, generator=generator)
    gate_up = torch.randn(2 * spec.ffn_hidden_size, h, generator=generator)
    q, k, v = qkv.split([spec.num_heads * d, spec.num_kv_heads * d, spec.num_kv_heads * d])
    for kind, fused, parts in (("qkv", qkv, [q, k, v]), ("fc1", gate_up, gate_up.chunk(2))):
        shards = [to_shard(f"{kind}_fused", [fused], spec, r, tp) for r in range(tp)]
        assert all(  # the same shards as the separate Hugging Face tensors give
            torch.equal(s, to_shard(kind, list(parts), spec, r, tp)) for r, s in enumerate(shards)
        )
        assert torch.equal(from_shards(f"{kind}_fused", shards, spec)[0], fused)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
def test_every_layout_round_trips_exactly(qwen3, tp, bias):
    config = qwen3.__class__.from_dict({**qwen3.to_dict(), "attention_bias": bias})
    spec = gpt_spec(config, tp)
    generator = torch.Generator().manual_seed(0)
    layer_of = {0: 5}
    for megatron_name in GPT_LAYER_WEIGHTS:
        name = f"decoder.layers.0.{megatron_name}"
        if (
            (megatron_name.endswith("bias") and not bias)
            or not spec.qk_norm
            and "layernorm" in name
        ):
            continue
        kind, hf_names = hf_names_of(name, layer_of, spec)
        assert all(n.startswith("model.layers.5.") for n in hf_names)
        shapes = _hf_shapes(spec, hf_names)
        tensors = [torch.randn(s, generator=generator) for s in shapes]
        shards = [to_shard(kind, tensors, spec, r, tp) for r in range(tp)]
        assert len({s.shape for s in shards}) == 1  # equal shards
        for got, want in zip(from_shards(kind, shards, spec), tensors, strict=True):
            assert torch.equal(got, want), name
    embedding = torch.randn(spec.vocab_size, spec.hidden_size, generator=generator)
    kind, _ = hf_names_of("output_layer.weight", layer_of, spec)
    shards = [to_shard(kind, [embedding], spec, r, tp) for r in range(tp)]
    assert sum(s.shape[0] for s in shards) == spec.padded_vocab_size
    assert torch.equal(from_shards(kind, shards, spec)[0], embedding)


def _hf_shapes(spec, hf_names) -> list[tuple[int, ...]]:
    h, d = spec.hidden_size, spec.head_dim
    sizes = {
        "q_proj": spec.num_heads * d,
        "k_proj": spec.num_kv_heads * d,
        "v_proj": spec.num_kv_heads * d,
        "gate_proj": spec.ffn_hidden_size,
        "up_proj": spec.ffn_hidden_size,
    }
    shapes = []
    for name in hf_names:
        module, kind = name.split(".")[-2:]
        if module in sizes:
            shapes.append((sizes[module], h) if kind == "weight" else (sizes[module],))
        elif module in ("o_proj",):
            shapes.append((h, spec.num_heads * d))
        elif module == "down_proj":
            shapes.append((h, spec.ffn_hidden_size))
        elif module in ("q_norm", "k_norm"):
            shapes.append((d,))
        else:
            shapes.append((h,))
    return shapes


def test_qkv_shards_hold_whole_key_value_groups(qwen3):
    spec = gpt_spec(qwen3, tp=2)  # 4 heads, 2 kv groups, head dim 16
    d, h = spec.head_dim, spec.hidden_size
    q = torch.arange(4).repeat_interleave(d).float()[:, None].expand(-1, h)
    k = (10 + torch.arange(2)).repeat_interleave(d).float()[:, None].expand(-1, h)
    v = (20 + torch.arange(2)).repeat_interleave(d).float()[:, None].expand(-1, h)
    shard = to_shard("qkv", [q, k, v], spec, 1, 2)
    # rank 1 holds group 1: query heads 2 and 3, key 11, value 21
    assert shard[:, 0].unique_consecutive().tolist() == [2.0, 3.0, 11.0, 21.0]


def test_lora_settings_follow_peft_and_refuse_what_they_cannot_train():
    from peft import LoraConfig

    settings = LoraSettings.from_peft(LoraConfig(r=8, lora_alpha=32, target_modules="all-linear"))
    assert (settings.r, settings.scale, settings.targets) == (8, 4.0, PROJECTIONS)
    rslora = LoraSettings.from_peft(
        LoraConfig(r=16, lora_alpha=8, use_rslora=True, target_modules="all-linear")
    )
    assert rslora.scale == 2.0
    some = LoraSettings.from_peft(LoraConfig(r=4, target_modules=["v_proj", "q_proj"]))
    assert some.targets == ("q_proj", "v_proj")
    with pytest.raises(ValueError, match=r"\['lm_head'\] cannot be targeted"):
        LoraSettings.from_peft(LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(ValueError, match="target_modules is None"):
        LoraSettings.from_peft(LoraConfig(r=4))
    with pytest.raises(ValueError, match="DoRA is not supported"):
        LoraSettings.from_peft(LoraConfig(r=4, target_modules="all-linear", use_dora=True))
    latent = projections_of(gpt_spec(_bundled("tiny-deepseek-v3"), tp=1))
    assert LoraSettings.from_peft(LoraConfig(r=4, target_modules="all-linear"), latent).targets[
        :6
    ] == ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
    with pytest.raises(ValueError, match=r"\['k_proj'\] cannot be targeted"):
        LoraSettings.from_peft(LoraConfig(r=4, target_modules=["q_a_proj", "k_proj"]), latent)
    with pytest.raises(ValueError, match=r"\['kv_b_proj'\] cannot be targeted"):
        LoraSettings.from_peft(LoraConfig(r=4, target_modules=["kv_b_proj"]))


def test_optimizer_names_map_or_fail_naming_the_supported_ones():
    assert optimizer_name("default") == "adam"
    assert optimizer_name(torch.optim.AdamW) == "adam"
    assert optimizer_name("SGD") == "sgd"
    with pytest.raises(ValueError, match="cannot use optimizer 'RMSprop'.*'default', 'AdamW'"):
        optimizer_name("RMSprop")


def test_importing_twinkle_model_does_not_import_megatron():
    code = (
        "import sys; from twinkle.model import MegatronModel; "
        "from twinkle.model.megatron import MegatronModel as M; "
        "assert M is MegatronModel; print('megatron' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


def test_missing_megatron_names_the_extra_to_install():
    code = (
        "import sys; sys.modules['megatron'] = None\n"
        "from twinkle.model import MegatronModel\n"
        "try:\n    MegatronModel('bundled://tiny-qwen3')\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "twinkle-models[megatron]" in done.stdout
