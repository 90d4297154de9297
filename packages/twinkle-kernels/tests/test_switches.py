"""The switches (TWINKLE_KERNELS, TWINKLE_NPU_*) decide the selection, on fake platforms: a
device type and ``is_installed`` pretended, no GPU or NPU code called."""

import warnings

import pytest

from twinkle.kernel import backends, registry, select, switches

NPU_OPS = {
    "rms_norm": "TWINKLE_NPU_FUSED_OPS",
    "rotary_embedding": "TWINKLE_NPU_FUSED_OPS",
    "swiglu": "TWINKLE_NPU_FUSED_OPS",
    "varlen_attention": "TWINKLE_NPU_FUSED_OPS",
    "grouped_matmul": "TWINKLE_NPU_MOE_PATCH",
}
CUDA_FAST = {
    "rms_norm": "liger",
    "rotary_embedding": "liger",
    "swiglu": "liger",
    "fused_linear_cross_entropy": "liger",
    "varlen_attention": "flash_attn",
    "grouped_matmul": "torch_grouped_mm",
    "chunk_gated_delta_rule": "fla",
    "causal_conv1d": "fla",
}
SWITCHES = ("TWINKLE_KERNELS", *sorted(set(NPU_OPS.values())), "TWINKLE_NPU_PATCH")


@pytest.fixture(autouse=True)
def clean_switches(monkeypatch):
    for name in (*SWITCHES, "TWINKLE_NPU_FLA"):
        monkeypatch.delenv(name, raising=False)
    registry._warn_unavailable.cache_clear()


@pytest.fixture
def everything_installed(monkeypatch):
    monkeypatch.setattr(registry, "is_installed", lambda package: True)


def test_every_documented_switch_defaults_on():
    read = switches.read()
    assert read.kernels == "auto"
    assert set(read.npu) == {
        "TWINKLE_NPU_PATCH",
        "TWINKLE_NPU_FUSED_OPS",
        "TWINKLE_NPU_MOE_PATCH",
        "TWINKLE_NPU_FLA",
    }
    assert all(s.enabled and not s.explicit for s in read.npu.values())


@pytest.mark.parametrize(("op", "fast"), sorted(CUDA_FAST.items()))
def test_cuda_picks_each_fast_path_when_installed_and_the_reference_otherwise(
    op, fast, monkeypatch
):
    monkeypatch.setattr(registry, "is_installed", lambda package: True)
    assert backends(op, "cuda")[0] == fast
    assert backends(op, "cpu") == ["torch"]
    needed = next(p.package for p in registry._fast_paths[op] if p.backend == fast)
    monkeypatch.setattr(registry, "is_installed", lambda package: package != needed)
    assert fast not in backends(op, "cuda")


@pytest.mark.parametrize(("op", "switch"), sorted(NPU_OPS.items()))
def test_each_npu_switch_turns_its_own_ops_off_and_the_master_all(
    op, switch, everything_installed, monkeypatch
):
    assert backends(op, "npu") == ["torch_npu", "torch"]
    monkeypatch.setenv(switch, "0")
    assert backends(op, "npu") == ["torch"]
    assert select(op, "npu") is registry._references[op]
    assert backends(op, "cuda")[0] != "torch"  # NPU switches leave CUDA alone
    others = [o for o, s in NPU_OPS.items() if s != switch]
    assert all(backends(o, "npu")[0] == "torch_npu" for o in others)
    monkeypatch.setenv(switch, "1")
    monkeypatch.setenv("TWINKLE_NPU_PATCH", "0")
    assert all(backends(o, "npu") == ["torch"] for o in NPU_OPS)


def test_twinkle_kernels_off_turns_every_fast_path_off_even_a_forced_one(
    everything_installed, monkeypatch
):
    monkeypatch.setenv("TWINKLE_KERNELS", "off")
    for op in CUDA_FAST:
        assert backends(op, "cuda") == ["torch"] and backends(op, "npu") == ["torch"]
    assert select("rms_norm", "cuda", backend="liger") is registry._references["rms_norm"]


def test_npu_fla_switch_gates_the_linear_attention_ops_on_npu(everything_installed, monkeypatch):
    # No NPU kernel of the gated delta rule is registered: the reference runs either way,
    # and an explicit request says so once.
    monkeypatch.setenv("TWINKLE_NPU_FLA", "1")
    with pytest.warns(RuntimeWarning, match="TWINKLE_NPU_FLA=1 asks for a fast path of "):
        assert select("causal_conv1d", "npu") is registry._references["causal_conv1d"]
    monkeypatch.setenv("TWINKLE_NPU_FLA", "0")
    assert not switches.read().allows("causal_conv1d", "npu")
    assert switches.read().allows("rms_norm", "npu")


def test_a_requested_fast_path_that_cannot_run_warns_once_and_runs_the_reference(monkeypatch):
    monkeypatch.setattr(registry, "is_installed", lambda package: False)
    monkeypatch.setenv("TWINKLE_NPU_FUSED_OPS", "1")
    with pytest.warns(RuntimeWarning) as caught:
        for _ in range(3):
            assert select("rms_norm", "cpu") is registry._references["rms_norm"]
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "TWINKLE_NPU_FUSED_OPS=1" in message and "rms_norm" in message and "on cpu" in message
    assert "'torch_npu' on npu" in message and "'liger_kernel' on cuda" in message
    monkeypatch.setenv("TWINKLE_KERNELS", "on")
    with pytest.warns(RuntimeWarning, match="TWINKLE_KERNELS=on asks for a fast path of swiglu"):
        select("swiglu", "cuda")
    # Unset switches are defaults, not requests: no warning.
    monkeypatch.delenv("TWINKLE_KERNELS")
    monkeypatch.delenv("TWINKLE_NPU_FUSED_OPS")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert select("varlen_attention", "cpu") is registry._references["varlen_attention"]


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [
        ("TWINKLE_NPU_PATCH", "maybe", "TWINKLE_NPU_PATCH='maybe' is not a switch value; set it"),
        ("TWINKLE_KERNELS", "fast", "TWINKLE_KERNELS='fast' is not a mode; use one of auto, on"),
    ],
)
def test_a_bad_switch_value_is_a_clear_error(name, value, match, monkeypatch):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        backends("rms_norm", "cpu")


@pytest.mark.parametrize(("value", "enabled"), [("0", False), ("false", False), ("1", True)])
def test_switch_values(value, enabled, monkeypatch):
    monkeypatch.setenv("TWINKLE_NPU_MOE_PATCH", value)
    assert switches.read().npu["TWINKLE_NPU_MOE_PATCH"].enabled is enabled
