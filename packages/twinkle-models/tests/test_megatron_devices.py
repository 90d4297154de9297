"""Where MegatronModel runs: the CPU mode (gloo), the device choice, and the NPU path's checks.

The CPU mode's maths is megatron-core's own and is proven equal to TransformersModel by
test_megatron_parallel, test_megatron_cp and test_megatron_extras, which run in it; here are
its edges: what it answers, that it stays in its thread and its calls, and that megatron's
model-parallel RNG becomes the CPU generator. The NPU path cannot run here (no torch_npu,
no MindSpeed): its device check fails with what is missing, MindSpeed's adaptor is imported
once (shown with a stand-in ``mindspeed`` package that counts its imports), and the Ascend
cookbook layouts are checked against the models they name.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from twinkle import DeviceMesh
from twinkle.model.megatron import _mindspeed_runtime
from twinkle.model.megatron.cpu_mode import cpu_mode, in_cpu_mode, runs_in_cpu_mode
from twinkle.model.megatron.device import resolve_device

ROOT = Path(__file__).resolve().parents[3]
ASCEND = ROOT / "cookbook" / "megatron" / "ascend"
NO_GPU = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="needs a machine without a CUDA GPU: it checks the CPU fallback",
)


# ---- the CPU mode -------------------------------------------------------------------------


def test_cpu_mode_answers_megatrons_cuda_calls_with_the_cpu():
    with cpu_mode():
        assert in_cpu_mode()
        made = torch.zeros(3, device="cuda")
        assert made.device.type == "cpu"
        assert torch.ones(2, device=torch.device("cuda", 0)).device.type == "cpu"
        assert made.cuda() is made
        assert made.to("cuda").device.type == "cpu"
        assert made.type() == "torch.cuda.FloatTensor"  # megatron's fp32-parameter check
        assert torch.empty(2, device=torch.cuda.current_device()).device.type == "cpu"
        assert not torch.tensor([1, 2], pin_memory=True).is_pinned()
        torch.cuda.synchronize()
        with cpu_mode():  # re-entrant
            assert in_cpu_mode()
        assert in_cpu_mode()
    assert not in_cpu_mode()


@NO_GPU
def test_outside_the_mode_torch_still_fails_without_a_gpu():
    with cpu_mode():
        pass
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")
    with pytest.raises((RuntimeError, AssertionError)):
        torch.cuda.current_device()
    assert torch.zeros(2).type() == "torch.FloatTensor"


@NO_GPU
def test_the_mode_stays_in_the_thread_that_entered_it():
    seen = {}

    def other_thread() -> None:
        seen["active"] = in_cpu_mode()
        try:
            torch.zeros(1, device="cuda")
            seen["cuda"] = "allowed"
        except (RuntimeError, AssertionError):
            seen["cuda"] = "refused"
        with cpu_mode():
            seen["own"] = torch.zeros(1, device="cuda").device.type

    with cpu_mode():
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert seen == {"active": False, "cuda": "refused", "own": "cpu"}


def test_megatrons_model_parallel_rng_is_the_cpu_generator_in_the_mode():
    from megatron.core.tensor_parallel import random as megatron_random

    tracker = megatron_random.get_cuda_rng_tracker()
    with cpu_mode():
        tracker.reset()
        torch.manual_seed(7)
        tracker.add("twinkle-test", 123)
        outside_before = torch.rand(2)
        with tracker.fork("twinkle-test"):
            forked = torch.rand(4)
        outside_after = torch.rand(2)
        tracker.reset()
    torch.manual_seed(123)
    assert torch.equal(forked, torch.rand(4))  # the fork draws from the seeded state
    torch.manual_seed(7)
    expected = torch.rand(4)
    # the fork leaves the default generator where it was
    assert torch.equal(torch.cat([outside_before, outside_after]), expected)


def test_methods_of_a_cpu_model_and_its_subclasses_run_in_the_mode():
    @runs_in_cpu_mode
    class Model:
        def __init__(self, device: str) -> None:
            self.device = torch.device(device)

        def where(self) -> bool:
            return in_cpu_mode()

        @staticmethod
        def plain() -> bool:
            return in_cpu_mode()

    class Sub(Model):
        def mine(self) -> bool:
            return in_cpu_mode()

    assert Model("cpu").where() and Sub("cpu").where() and Sub("cpu").mine()
    assert not Model("meta").where()  # an accelerator model never enters it
    assert not Model.plain()


def test_megatron_model_keeps_its_remote_specs_under_the_mode_wrapper():
    from twinkle.infra.remote import find_remote_spec
    from twinkle.model import MegatronModel
    from twinkle.model.batch_dispatch import slice_dp_rows

    assert getattr(MegatronModel.forward_backward, "__twinkle_cpu_mode__", False)
    spec = find_remote_spec(MegatronModel, "forward_backward")
    assert spec.dispatch is slice_dp_rows and spec.collect == "rows"
    assert find_remote_spec(MegatronModel, "calculate_metric").collect == "first"


# ---- choosing the device ------------------------------------------------------------------


@NO_GPU
def test_without_a_gpu_the_cpu_is_chosen_unless_a_device_is_asked_for():
    assert resolve_device(None, "cuda") == torch.device("cpu")  # the meshes' default
    assert resolve_device(None, "cpu") == torch.device("cpu")
    assert resolve_device("cpu", "cuda") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU.*device='cpu'"):
        resolve_device("cuda", "cuda")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        resolve_device(torch.device("cuda", 1), "cpu")


def test_bad_devices_name_the_supported_ones():
    with pytest.raises(ValueError, match="'cuda', 'npu', 'cpu', not 'tpu'"):
        resolve_device("tpu", "cuda")
    with pytest.raises(ValueError, match="no valid index"):
        resolve_device("npu:first", "cuda")
    with pytest.raises(TypeError, match="str or a torch.device"):
        resolve_device(0, "cuda")


@pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is not None,
    reason="needs a machine without torch_npu (no Ascend NPU): it checks the refusal there",
)
def test_an_npu_without_torch_npu_fails_at_the_device_check():
    for device, mesh in (("npu", "cuda"), (None, "npu"), ("npu:1", "cpu")):
        with pytest.raises(RuntimeError, match="needs an Ascend NPU.*torch_npu is not installed"):
            resolve_device(device, mesh)


# ---- MindSpeed ----------------------------------------------------------------------------


def _run(code: str, *, path: Path | None = None) -> subprocess.CompletedProcess:
    env_path = [str(path)] if path else []
    prelude = f"import sys; sys.path[:0] = {env_path!r}\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=180
    )


@pytest.mark.skipif(
    importlib.util.find_spec("mindspeed") is not None,
    reason="needs MindSpeed absent: it checks the install message",
)
def test_without_mindspeed_the_adaptor_check_says_how_to_install_it():
    with pytest.raises(ImportError, match="needs MindSpeed.*gitcode.com/Ascend/MindSpeed"):
        _mindspeed_runtime.ensure_mindspeed_adaptor_patched()


def test_the_adaptor_is_imported_once_before_megatron(tmp_path):
    package = tmp_path / "mindspeed"
    package.mkdir()
    (package / "__init__.py").write_text("")
    # stands in for MindSpeed's adaptor: records whether megatron.core was already imported
    (package / "megatron_adaptor.py").write_text(
        "import sys\nIMPORTS = getattr(sys, '_adaptor_imports', 0) + 1\n"
        "sys._adaptor_imports = IMPORTS\nMEGATRON_FIRST = 'megatron.core' in sys.modules\n"
    )
    code = (
        "from twinkle.model.megatron._mindspeed_runtime import ensure_mindspeed_adaptor_patched\n"
        "ensure_mindspeed_adaptor_patched(); ensure_mindspeed_adaptor_patched()\n"
        "import mindspeed.megatron_adaptor as a\n"
        "print(a.IMPORTS, a.MEGATRON_FIRST)\n"
    )
    done = _run(code, path=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "False"]
    late = _run("import megatron.core\n" + code, path=tmp_path)
    assert late.returncode == 0, late.stderr[-2000:]
    assert late.stdout.split() == ["1", "True"]
    assert "megatron.core was imported before MindSpeed's adaptor" in late.stderr


# ---- the Ascend cookbook --------------------------------------------------------------------


def _cookbook(name: str):
    sys.path.insert(0, str(ASCEND))
    try:
        spec = importlib.util.spec_from_file_location(f"ascend_{name}", ASCEND / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ASCEND))


def _qwen3_4b():
    from transformers import Qwen3Config

    return Qwen3Config(
        hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8
    )


def _qwen3_30b_a3b():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        hidden_size=2048,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
    )


@pytest.mark.parametrize(
    ("name", "model", "world"),
    [
        ("tp_npu", _qwen3_4b, 8),
        ("tp_moe_npu", _qwen3_30b_a3b, 8),
        ("tp_moe_cp_npu", _qwen3_30b_a3b, 8),
    ],
)
def test_ascend_layouts_fit_the_models_they_name_on_eight_cards(name, model, world):
    from twinkle.model.megatron.layout import MegatronLayout

    module = _cookbook(name)
    mesh = DeviceMesh.from_sizes(**module.SIZES, device_type="cpu")
    layout = MegatronLayout.from_mesh(mesh)
    assert layout.world_size == world
    layout.check_model(model())  # raises naming the size that does not divide


def test_the_ascend_dataset_encodes_the_self_cognition_rows(monkeypatch):
    monkeypatch.setenv("DATASET_ID", "bundled://self-cognition")
    module = _cookbook("tp_npu")
    dataset = module.build_dataset("bundled://tiny-qwen3", rows=8)
    assert len(dataset) == 8
    row = dataset[0]
    assert len(row["input_ids"]) == len(row["labels"]) <= 512
    assert any(label != -100 for label in row["labels"])


@pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is not None,
    reason="needs a machine without torch_npu (no Ascend NPU): it checks the refusal there",
)
@pytest.mark.parametrize("script", ["tp_npu.py", "tp_moe_npu.py", "tp_moe_cp_npu.py"])
def test_ascend_scripts_stop_at_the_device_check_without_an_npu(script, child_env):
    done = subprocess.run(
        [sys.executable, str(ASCEND / script)],
        cwd=ASCEND,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "cookbook/megatron/ascend needs an Ascend NPU" in done.stderr
    assert "torch_npu is not installed" in done.stderr
    assert "Traceback" in done.stderr and "require_npu" in done.stderr  # at the check, first


# ---- INSTALL_MEGATRON.sh --------------------------------------------------------------------


def test_install_script_installs_the_megatron_extra_from_the_checkout():
    script = ROOT / "INSTALL_MEGATRON.sh"
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    dry = subprocess.run(["sh", str(script), "--dry-run"], env=env, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert "-m pip install" in dry.stdout
    assert f"-e {ROOT}/packages/twinkle-models[megatron]" in dry.stdout
    check = subprocess.run(
        ["sh", str(script), "--check"], env=env, capture_output=True, text=True, timeout=180
    )
    assert check.returncode == 0, check.stderr[-2000:]
    assert "megatron-core 0.16" in check.stdout and "MegatronModel is ready on" in check.stdout
    bad = subprocess.run(["sh", str(script), "--gpu"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown option --gpu" in bad.stderr
