"""LoRA on a Qwen3-MoE's experts and router in MegatronModel, against peft on the Hugging Face
model (transformers 5's fused expert tensors, peft 0.21's ``target_parameters``).

Two launches of scripts/megatron_lora_experts.py on 2 CPU processes (about 20 s each on
2 cores): ep1 / ep2 / experts-only (rsLoRA), and etp2 / tp2 with sequence parallel (etp2
and etp1) / pp2. Tolerances: logps agree with peft's to 1e-5 at a shared random init and after
each of two AdamW steps, gradient norms to 5e-6 relative (float32 summation order differs
across shards, and the second norm follows an AdamW step: 1.25e-6 measured on tp2sp_etp1
with the real Qwen3 template's rows; a shard's gradient share dropped from one small
parameter was 3.2e-5 off in MegatronModel's MLA); the exported adapter loaded with peft and
the exported merged model reproduce Megatron's logps to 1e-5; the merged weights equal
peft's merge_and_unload to 1e-6; resumes are exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig
from safetensors.torch import load_file

from twinkle.model.megatron.lora import LoraSettings
from twinkle.model.megatron.lora_experts import peft_config_for

SCRIPT = Path(__file__).parent / "scripts" / "megatron_lora_experts.py"
LOGPS_TOL = 1e-5
NORM_RTOL = 5e-6
EXPERT_NAMES = [
    "base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight",  # gate_up
    "base_model.model.model.layers.0.mlp.experts.base_layer.lora_B.weight",
    "base_model.model.model.layers.0.mlp.experts.lora_A.weight",  # down_proj
    "base_model.model.model.layers.0.mlp.experts.lora_B.weight",
]
ROUTER_NAMES = [
    "base_model.model.model.layers.0.mlp.gate.lora_A.weight",
    "base_model.model.model.layers.0.mlp.gate.lora_B.weight",
]


def _launch(tmp_path_factory, torchrun, *cases: str) -> tuple[list[dict], Path]:
    tmp = tmp_path_factory.mktemp("megatron_lora_experts")
    torchrun(SCRIPT, tmp, *cases, procs=2, timeout=300)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)], tmp


@pytest.fixture(scope="module")
def expert_parallel(tmp_path_factory, torchrun):
    return _launch(tmp_path_factory, torchrun, "ep1", "ep2", "ep2_experts")


@pytest.fixture(scope="module")
def other_layouts(tmp_path_factory, torchrun):
    return _launch(tmp_path_factory, torchrun, "etp2", "tp2sp", "tp2sp_etp1", "pp2")


def _check_case(ranks: list[dict], case: str, names: list[str]) -> None:
    for rank in ranks:
        result = rank[case]
        assert result["init_logps_diff"] < LOGPS_TOL
        assert max(result["logps_diffs"]) < LOGPS_TOL
        assert result["grad_norms"] == pytest.approx(result["reference_grad_norms"], rel=NORM_RTOL)
        assert result["trained_change"] > 0.1  # the two steps moved the logps
        assert result["progress"] == {"consumed_train_samples": 4, "step": 2}
        assert result["resumed_logps_equal"] is True
        assert result["weights_only_logps_equal"] is True
        assert result["own_init_logps_diff"] < LOGPS_TOL  # B = 0: the base model
    first = ranks[0][case]
    assert first["saved_shapes_equal_peft"] is True  # peft's names and shapes, all of them
    assert first["saved_names"] == names
    assert first["peft_logps_diff"] < LOGPS_TOL
    assert first["merged_logps_diff"] < LOGPS_TOL
    assert first["merged_weights_diff"] < 1e-6


@pytest.mark.parametrize(
    ("case", "names"),
    [
        ("ep1", EXPERT_NAMES + ROUTER_NAMES),
        ("ep2", EXPERT_NAMES + ROUTER_NAMES),
        ("ep2_experts", EXPERT_NAMES),  # gate_proj/up_proj/down_proj: no router
    ],
)
def test_lora_on_experts_matches_peft_under_expert_parallel(expert_parallel, case, names):
    _check_case(expert_parallel[0], case, names)


@pytest.mark.parametrize("case", ["etp2", "tp2sp", "tp2sp_etp1", "pp2"])
def test_lora_on_experts_matches_peft_under_tensor_and_pipeline_parallel(other_layouts, case):
    _check_case(other_layouts[0], case, EXPERT_NAMES + ROUTER_NAMES)


def test_own_init_does_not_depend_on_the_expert_layout(expert_parallel):
    ranks, _ = expert_parallel
    ep1 = load_file(ranks[0]["ep1"]["own_init_adapter"])
    ep2 = load_file(ranks[0]["ep2"]["own_init_adapter"])
    assert sorted(ep1) == sorted(ep2)
    for name in ep1:
        assert torch.equal(ep1[name], ep2[name]), name
    a = ep1[EXPERT_NAMES[0]]
    assert a.abs().max() > 0  # A drawn, B zero, as peft initialises
    assert ep1[EXPERT_NAMES[1]].abs().max() == 0


def _moe_config():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
    )


def test_all_linear_on_qwen3_moe_adapts_attention_experts_and_router_as_peft_does():
    config = peft_config_for(
        LoraConfig(r=2, lora_alpha=4, target_modules="all-linear"), _moe_config()
    )
    settings = LoraSettings.from_peft(config)
    assert set(settings.targets) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert settings.expert_targets == ("gate_up_proj", "down_proj")
    assert settings.router is True
    # peft fuses gate and up: rank 2r and alpha 2·alpha for gate_up_proj, the rest r and alpha
    assert settings.rank_and_scale("model.layers.1.mlp.experts.gate_up_proj") == (4, 2.0)
    assert settings.rank_and_scale("model.layers.1.mlp.experts.down_proj") == (2, 2.0)
    assert settings.rank_and_scale("model.layers.1.mlp.gate.weight") == (2, 2.0)
    rslora = LoraConfig(r=2, lora_alpha=4, target_modules=["gate_proj", "up_proj"], use_rslora=True)
    settings = LoraSettings.from_peft(peft_config_for(rslora, _moe_config()))
    assert settings.expert_targets == ("gate_up_proj",) and settings.router is False
    assert settings.rank_and_scale("model.layers.0.mlp.experts.gate_up_proj") == (4, 4.0)


def test_dense_models_keep_their_config():
    from transformers import Qwen3Config

    config = LoraConfig(r=2, target_modules="all-linear")
    assert peft_config_for(config, Qwen3Config()) is config


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (dict(target_modules="all-linear", lora_dropout=0.1), "lora_dropout"),
        (dict(target_modules=["gate_proj"]), "without also targeting up_proj"),
    ],
)
def test_lora_on_experts_refuses_what_peft_refuses(arguments, message):
    with pytest.raises(ValueError, match=message):
        LoraSettings.from_peft(peft_config_for(LoraConfig(r=2, **arguments), _moe_config()))


def test_unknown_target_parameters_are_refused_by_name():
    config = LoraConfig(r=2, target_modules=[], target_parameters=["mlp.experts.gate_up_proj", "x"])
    with pytest.raises(ValueError, match=r"target_parameters \['x'\]"):
        LoraSettings.from_peft(config)


def test_expert_targets_on_a_dense_model_are_refused():
    from transformers import AutoConfig

    from twinkle.hub import resolve_model
    from twinkle.model.megatron.config import gpt_spec
    from twinkle.model.megatron.lora import inject_lora

    spec = gpt_spec(AutoConfig.from_pretrained(resolve_model("bundled://tiny-qwen3")), 1)
    config = LoraConfig(r=2, target_modules=["q_proj"], target_parameters=["gate_up_proj"])
    with pytest.raises(ValueError, match="qwen3 model has none"):
        inject_lora(None, spec, LoraSettings.from_peft(config), 1, 0, seed=0)
