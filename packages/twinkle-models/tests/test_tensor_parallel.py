"""Tensor parallel on the model families and combined with dp, Ulysses SP and EP under
torchrun (scripts/tp_combinations.py: one 2-rank launch, tp=2 on Qwen3-MoE, Qwen3.5,
Qwen3.5-MoE, DeepSeek-V3 and GLM-4.5; one 4-rank launch, dp2 × tp2, dp2 × tp2 ×
ulysses2, fsdp2 × tp2 × ulysses2, dp2 × tp2 × ep2 and fsdp2 × tp2 × ep2), each against the
same function in one process; and the bad inputs, refused at setup before any process group
is needed (dense tp and fsdp × tp train in test_parallel_strategies).

Tolerances (float32), as the dense TP tests: losses rel 1e-6 (the first step's; later ones
rel 1e-5 where experts are routed: AdamW turns float32 noise into step-sized differences,
as in test_expert_parallel), first-step gradients 1e-5 of each tensor's largest entry,
with an absolute floor of 1e-9 (Qwen3.5-MoE's dt_bias, whose largest gradient is 6e-7,
measured 7e-11), weights after 3 AdamW steps abs 1e-5 (1e-4 with routed experts or Ulysses:
measured 1.2e-5 on LoRA under tp × ulysses, and 1.7e-5 on full Qwen3.5 on some machines);
the saved folders load in one process with transformers / peft and equal the gathered
weights.
"""

import importlib.util
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from twinkle.hub import resolve_model
from twinkle.mesh import DeviceMesh
from twinkle.model.transformers.strategy.parallelize import parallelize


def model_of(name: str, **changes):
    config = AutoConfig.from_pretrained(resolve_model(f"bundled://{name}"))
    for key, value in changes.items():
        setattr(config, key, value)
    return AutoModelForCausalLM.from_config(config)


def mesh(**sizes) -> DeviceMesh:
    return DeviceMesh.from_sizes(device_type="cpu", **sizes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "tp_size=8 does not divide the model's 4 attention heads"),
        ({"num_attention_heads": 8}, "tp_size=8 does not divide the model's 2 key/value heads"),
    ],
)
def test_tp_that_does_not_divide_the_heads_names_both_numbers(changes, message):
    with pytest.raises(ValueError, match=message):
        parallelize(model_of("tiny-qwen3", **changes), mesh(tp_size=8))


@pytest.mark.parametrize(
    ("name", "changes", "message"),
    [
        ("tiny-qwen3-moe", {"num_key_value_heads": 1}, "does not divide the model's 1 key/value"),
        ("tiny-qwen3.5", {"num_attention_heads": 6}, "tp_size=4 does not divide the model's 6 att"),
        (
            "tiny-qwen3.5-moe",
            {"num_key_value_heads": 4, "shared_expert_intermediate_size": 30},
            "30 shared expert's width",
        ),
        ("tiny-deepseek-v3", {"num_attention_heads": 6}, "tp_size=4 does not divide the model's 6"),
        (
            "tiny-glm4.5",
            {"num_key_value_heads": 4, "moe_intermediate_size": 30},
            "30 shared experts' width",
        ),
    ],
)
def test_each_new_plan_checks_the_widths_it_splits(name, changes, message):
    with pytest.raises(ValueError, match=message):
        parallelize(model_of(name, **changes), mesh(tp_size=4))


def test_a_family_without_a_plan_names_those_with_one():
    with pytest.raises(ValueError, match="no tensor-parallel plan for 'phi3'") as info:
        parallelize(model_of("tiny-phi4"), mesh(tp_size=2))
    expected = "deepseek_v3, gemma3, glm4_moe, llama, mistral, qwen2, qwen3, qwen3_5, qwen3_moe"
    assert expected in str(info.value)


def test_tp_times_ulysses_must_divide_the_heads_naming_the_numbers():
    # 2 key/value heads: tp=2 gives each rank 1, which Ulysses cannot split over 2 ranks.
    with pytest.raises(
        ValueError,
        match=r"tp_size=2 × ulysses_size=2 = 4 does not divide the "
        r"model's 2 key/value heads.*each rank 1 of them",
    ):
        parallelize(model_of("tiny-qwen3"), mesh(dp_size=2, tp_size=2, ulysses_size=2))


def test_expert_tensor_parallel_is_refused_saying_why():
    sizes = {"tp_size": 2, "dp_size": 2, "ep_size": 2, "etp_size": 2}
    with pytest.raises(ValueError, match="etp_size=2: TransformersModel keeps every expert whole"):
        parallelize(model_of("tiny-qwen3-moe"), mesh(**sizes))


def test_a_tp_mesh_is_checked_against_the_launched_processes():
    with pytest.raises(ValueError, match="torchrun --nproc_per_node=2"):
        parallelize(model_of("tiny-llama3"), mesh(tp_size=2))


SCRIPT = Path(__file__).parent / "scripts" / "tp_combinations.py"


def load_script():
    spec = importlib.util.spec_from_file_location("tp_combinations", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    return load_script()


def launched(torchrun, tmp_path_factory, what: str, procs: int) -> dict:
    out = tmp_path_factory.mktemp(what)
    torchrun(SCRIPT, what, out, procs=procs, timeout=900)
    return torch.load(out / f"{what}.pt", weights_only=False)


@pytest.fixture(scope="module")
def families(torchrun, tmp_path_factory) -> dict:
    return launched(torchrun, tmp_path_factory, "families", 2)


@pytest.fixture(scope="module")
def combined(torchrun, tmp_path_factory) -> dict:
    return launched(torchrun, tmp_path_factory, "combined", 4)


def assert_close(got: dict, expected: dict, *, atol: float = 0, relative: float = 0) -> None:
    assert set(got) == set(expected) and expected
    for name, tensor in expected.items():
        bound = atol + relative * float(tensor.abs().max())
        diff = float((got[name] - tensor).abs().max())
        assert diff <= bound, f"{name}: differs by {diff:.3g} (bound {bound:.3g})"


def check_case(got: dict, expected: dict, routed: bool) -> None:
    """``routed``: experts routed, or Ulysses attention summing in another order; AdamW turns
    the float32 noise into step-sized differences."""
    (first, *later), (first_ref, *later_ref) = got["losses"], expected["losses"]
    assert first == pytest.approx(first_ref, rel=1e-6)
    assert later == pytest.approx(later_ref, rel=1e-5 if routed else 1e-6)
    assert got["grad_norms"] == pytest.approx(expected["grad_norms"], rel=1e-4)
    # EP keeps each rank's experts out of the gathered gradients; the rest is compared.
    grads = {k: v for k, v in expected["grads"].items() if k in got["grads"]}
    assert len(grads) >= len(expected["grads"]) - 4
    assert_close(got["grads"], grads, atol=1e-9, relative=1e-5)
    assert_close(got["weights"], expected["weights"], atol=1e-4 if routed else 1e-5)


def check_folder(folder: str, kind: str, name: str, changes: dict, weights: dict) -> None:
    """The saved folder, loaded in one process, holds the gathered weights."""
    if kind == "full":
        state = AutoModelForCausalLM.from_pretrained(folder).state_dict()
        assert_close({k: state[k] for k in weights}, weights)
        return
    base = AutoModelForCausalLM.from_config(load_script().config_of(name, changes))
    params = dict(PeftModel.from_pretrained(base, folder).named_parameters())
    assert_close({k: params[k] for k in weights}, weights)
    assert load_file(Path(folder) / "adapter_model.safetensors")


MOE = ("qwen3_moe", "qwen3_5_moe", "deepseek_v3", "glm4_moe")
# Machine-dependent noise: full Qwen3.5 (AdamW at lr 1e-2) passed 1e-5 on the CI machines of
# stop 29 and measured 1.7e-5 on another of the same kind, at 968ba03 as at 30298c0, with the
# first-step gradients within 1e-5 relative on both; the routed bounds hold it.
NOISY = (*MOE, "qwen3_5")


@pytest.mark.parametrize("family", list(load_script().FAMILIES))
@pytest.mark.parametrize("kind", ["full", "lora"])
def test_tp_on_each_family_trains_like_one_process(families, script, family, kind):
    name = script.FAMILIES[family]
    expected = script.run(script.config_of(name, {}), kind, None, None)
    got = families[f"{family}_{kind}"]
    check_case(got, expected, routed=family in NOISY)
    check_folder(got["folder"], kind, name, {}, got["weights"])


@pytest.mark.parametrize("layout", list(load_script().COMBINED))
@pytest.mark.parametrize("kind", ["full", "lora"])
def test_tp_combined_with_dp_sp_and_ep_trains_like_one_process(combined, script, layout, kind):
    _, (name, changes) = script.COMBINED[layout]
    expected = script.run(script.config_of(name, changes), kind, None, None, script.ATTENTION_LORA)
    got = combined[f"{layout}_{kind}"]
    check_case(got, expected, routed="ep" in layout or "sp" in layout)
    if "folder" in got:  # every expert gathered whole into the one folder
        check_folder(got["folder"], kind, name, changes, got["weights"])
