"""The test tiers of the whole workspace: what CI runs and what the developer's loop skips.

``pytest -m "not processes and not slow"`` (``nox -s fast``) is the developer's loop; CI runs
everything. A test is marked ``processes`` when it uses a fixture that starts processes
(torchrun, a Ray cluster, a server subprocess), when its own code starts them, or when its
module's helpers do: automatically, so a new test cannot land in the fast tier by forgetting
a decorator. ``slow`` marks the few in-process tests that train until a quality bar is met
(a reward rises, embeddings separate): they are listed here, by their measured time.
"""

from __future__ import annotations

import ast
import inspect
import re
from functools import cache
from pathlib import Path

import pytest

# Fixtures (of the packages' conftest files) whose setup starts other processes.
PROCESS_FIXTURES = frozenset({"torchrun", "child_env", "ray_cluster", "server_process"})
# What a module that starts processes itself contains.
STARTS_PROCESSES = re.compile(
    r"\bsubprocess\.(?:run|Popen|call|check_call|check_output)\b|\bPopen\(|\bmultiprocessing\.\w"
    r"|\bray\.init\(|initialize\(\s*[\"']ray"
)


# In-process tests of more than ~5 s on a quiet core (seconds measured under load 10 in the
# fast tier of 2026-12-02): "path::name" or a prefix of "path::name[params]".
SLOW_TESTS = (
    "packages/twinkle-rl/tests/test_cookbook_rl.py::test_grpo_raises_the_held_out_reward",  # 330
    "packages/twinkle-rl/tests/test_cookbook_rl.py::test_ppo_raises_the_held_out_reward",  # 411
    "packages/twinkle-rl/tests/test_cookbook_rl.py::test_gkd_lowers_the_held_out_kl",  # 83
    "packages/twinkle-rl/tests/test_cookbook_rl.py::test_on_policy_distillation_",  # 6 to 15
    "packages/twinkle-rl/tests/test_cookbook_agentic.py::test_decoupled_ppo_",  # 113
    "packages/twinkle-kit/tests/test_gpu_validation_scripts.py::test_the_agentic_check_",  # 31
    "packages/twinkle-models/tests/test_embedding_minilm.py::test_training_pulls_held_out_pairs",
    "packages/twinkle-models/tests/test_padding_free.py::test_packed_training_equals_padded_"
    "training[qwen3_5_text",  # 77 and 56, its other families stay fast
    "packages/twinkle-models/tests/test_embedding_model.py::test_lora_embedding_training_lowers",
    "packages/twinkle-models/tests/test_documents_evaluation.py::test_the_pages_eval_loop",  # 28
    "packages/twinkle-rl/tests/test_cookbook_rl.py::test_dpo_grows_the_reward_margin",  # 27
    "packages/twinkle-rl/tests/test_cookbook_agentic.py::test_agentic_grpo_runs_",  # 34 to 115
    "packages/twinkle-models/tests/test_embedding_model.py::test_an_encoder_trains_as_an",  # 24
    "packages/twinkle-kernels/tests/test_gated_delta_net_patch.py::test_packed_logits_and_"
    "gradients_equal_each_sequence_alone",  # 22 and 18
    "packages/twinkle-models/tests/test_compile.py::test_compiled_layers_train_like_eager",  # 86
)
ROOT = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "processes: starts processes (torchrun, Ray, a server, a script); slow tier"
    )
    config.addinivalue_line(
        "markers", "slow: trains in process until a quality bar is met; slow tier"
    )


def _is_slow(item: pytest.Item) -> bool:
    where = f"{Path(item.path).resolve().relative_to(ROOT).as_posix()}::{item.name}"
    return where.startswith(SLOW_TESTS)


@cache
def _helpers_start_processes(path: Path) -> bool:
    """Whether the module's code outside its test functions (helpers, fixtures) starts processes."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]
    lines = source.splitlines()
    for test in tests:  # blank the tests out: what is left is shared by all of them
        start = min([test.lineno, *(d.lineno for d in test.decorator_list)]) - 1
        lines[start : test.end_lineno] = [""] * (test.end_lineno - start)
    return bool(STARTS_PROCESSES.search("\n".join(lines)))


def _starts_processes(item: pytest.Item) -> bool:
    if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    function = getattr(item, "function", None)
    if function is not None and STARTS_PROCESSES.search(inspect.getsource(function)):
        return True
    return _helpers_start_processes(Path(item.path))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _starts_processes(item):
            item.add_marker(pytest.mark.processes)
        if _is_slow(item):
            item.add_marker(pytest.mark.slow)


FAKE_VLLM = ROOT / "packages" / "twinkle-rl" / "tests" / "fake_vllm"


@pytest.fixture(scope="module")
def fake_vllm():
    """vLLM's interface without vLLM (``fake_vllm/vllm``, first on ``sys.path`` for the
    module, its modules gone from ``sys.modules`` after): yields ``with_a_gpu(build, ...)``,
    which calls ``build`` while torch reports a CUDA device, as vLLMSampler's check requires;
    nothing else takes a CUDA path."""
    import sys

    import torch

    def with_a_gpu(build, *args, **kwargs):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(torch.cuda, "is_available", lambda: True)
            return build(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(FAKE_VLLM))
        yield with_a_gpu
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]
