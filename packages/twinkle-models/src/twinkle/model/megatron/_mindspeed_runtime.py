"""Megatron-core on an Ascend NPU: torch_npu for the device, MindSpeed's adaptor for megatron-core.

MindSpeed (``mindspeed.megatron_adaptor``) patches megatron-core when it is imported: CUDA
calls become NPU calls and the fused kernels become Ascend ones. Its patches replace module
attributes, so it must be imported before ``megatron.core`` is. MegatronModel
calls ``ensure_mindspeed_adaptor_patched()`` first when its device is an NPU; a script may
call it itself at the top, as the installation guide's check does.

The versions the guide names: Megatron-LM v0.15.3 with MindSpeed core_r0.15.3, torch and
torch_npu of one version (2.7.1).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

from twinkle.utils import get_logger

logger = get_logger()

ADAPTOR = "mindspeed.megatron_adaptor"
MINDSPEED_HINT = (
    "install MindSpeed for Ascend NPUs: git clone https://gitcode.com/Ascend/MindSpeed.git && "
    "cd MindSpeed && git checkout core_r0.15.3 && pip install -e . (see INSTALL_MEGATRON.sh)"
)


def npu_problem() -> str | None:
    """Why this process cannot use an Ascend NPU (None when it can)."""
    if importlib.util.find_spec("torch_npu") is None:
        return "torch_npu is not installed (install the torch_npu wheel matching torch and CANN)"
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    if not torch.npu.is_available():
        return "torch_npu is installed but no NPU is visible (check ASCEND_RT_VISIBLE_DEVICES)"
    return None


def require_npu(what: str = "this run") -> None:
    """The device check of the NPU scripts: a RuntimeError naming what is missing."""
    problem = npu_problem()
    if problem is not None:
        raise RuntimeError(
            f"{what} needs an Ascend NPU with torch_npu and MindSpeed: {problem}. On a GPU or a "
            "CPU, run the same layout with cookbook/megatron/tp.py (torchrun)"
        )


def ensure_mindspeed_adaptor_patched() -> None:
    """Import MindSpeed's megatron adaptor once, so megatron-core runs on the NPU; an
    ImportError that says how to install MindSpeed when it is missing. Idempotent."""
    if ADAPTOR in sys.modules:
        return
    if importlib.util.find_spec("mindspeed") is None:
        raise ImportError(f"MegatronModel on an NPU needs MindSpeed: {MINDSPEED_HINT}")
    if "megatron.core" in sys.modules:
        # megatron.core imports its layers at once; names they took from each other keep
        # megatron-core's CUDA versions after MindSpeed patches the modules.
        logger.warning(
            "megatron.core was imported before MindSpeed's adaptor: call "
            "ensure_mindspeed_adaptor_patched() (or import %s) before importing megatron",
            ADAPTOR,
        )
    importlib.import_module(ADAPTOR)
