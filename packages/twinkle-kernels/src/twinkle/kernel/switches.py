"""The environment switches of the kernel fast paths, read here and nowhere else.

- ``TWINKLE_KERNELS`` (default ``auto``): ``auto`` runs a fast path where its device and
  package are present; ``off`` runs every op's torch reference, on every device; ``on`` is
  ``auto`` that also warns once per op and device where only the reference can run.
- ``TWINKLE_NPU_PATCH`` (default ``1``): master switch of every NPU fast path; ``0`` runs
  the torch references on NPU (transformers' own computation).
- ``TWINKLE_NPU_FUSED_OPS`` (default ``1``): torch_npu's fused RMSNorm, RoPE, SwiGLU and
  attention.
- ``TWINKLE_NPU_MOE_PATCH`` (default ``1``): torch_npu's grouped matmul for MoE experts.
- ``TWINKLE_NPU_FLA`` (default ``1``): the linear-attention kernels (Qwen3.5's gated delta
  rule and causal conv1d) on NPU; ``0`` forces the torch reference.

The NPU switches only gate fast paths on NPU tensors; on CUDA only ``TWINKLE_KERNELS`` counts.
A switch set explicitly to ``1`` (or ``TWINKLE_KERNELS=on``) *requests* its fast paths:
where one cannot run (another device, a missing package), the op warns once and runs its
reference. An unset switch takes its default silently.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

KERNELS = "TWINKLE_KERNELS"
NPU_PATCH = "TWINKLE_NPU_PATCH"
NPU_FUSED_OPS = "TWINKLE_NPU_FUSED_OPS"
NPU_MOE_PATCH = "TWINKLE_NPU_MOE_PATCH"
NPU_FLA = "TWINKLE_NPU_FLA"

KERNELS_MODES = ("auto", "on", "off")
TRUE, FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")

NPU_SWITCH_OF_OP = {
    "rms_norm": NPU_FUSED_OPS,
    "rotary_embedding": NPU_FUSED_OPS,
    "swiglu": NPU_FUSED_OPS,
    "varlen_attention": NPU_FUSED_OPS,
    "grouped_matmul": NPU_MOE_PATCH,
    "chunk_gated_delta_rule": NPU_FLA,
    "causal_conv1d": NPU_FLA,
}
"""Which NPU switch governs each op's NPU fast path (besides ``TWINKLE_NPU_PATCH``); an op
not listed here (fused linear cross-entropy) has no NPU fast path."""


@dataclass(frozen=True)
class Setting:
    """One switch as read: its value and whether the user set it (an explicit request)."""

    enabled: bool
    explicit: bool


@dataclass(frozen=True)
class Switches:
    """Every switch, read from the environment at one moment (``read()``)."""

    kernels: str
    npu: dict[str, Setting]

    def allows(self, op: str, device_type: str) -> bool:
        """Whether the switches let ``op`` take a fast path on ``device_type``."""
        if self.kernels == "off":
            return False
        if device_type != "npu":
            return True
        switch = NPU_SWITCH_OF_OP.get(op)
        return self.npu[NPU_PATCH].enabled and (switch is None or self.npu[switch].enabled)

    def requesting(self, op: str) -> str | None:
        """The switch that explicitly asks for ``op``'s fast path, if any (for the warning)."""
        if self.kernels == "on":
            return f"{KERNELS}=on"
        if not self.allows(op, "npu"):
            return None
        names = [n for n in (NPU_SWITCH_OF_OP.get(op), NPU_PATCH) if n and self.npu[n].explicit]
        return f"{names[0]}=1" if names else None


def _flag(name: str) -> Setting:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return Setting(enabled=True, explicit=False)
    value = raw.strip().lower()
    if value in TRUE:
        return Setting(enabled=True, explicit=True)
    if value in FALSE:
        return Setting(enabled=False, explicit=True)
    raise ValueError(f"{name}={raw!r} is not a switch value; set it to 1 (on) or 0 (off)")


def read() -> Switches:
    """The switches as the environment holds them now (a bad value is a ValueError)."""
    kernels = os.environ.get(KERNELS, "").strip().lower() or "auto"
    kernels = {"1": "on", "0": "off", "true": "on", "false": "off"}.get(kernels, kernels)
    if kernels not in KERNELS_MODES:
        raise ValueError(
            f"{KERNELS}={os.environ[KERNELS]!r} is not a mode; use one of "
            f"{', '.join(KERNELS_MODES)}"
        )
    names = (NPU_PATCH, NPU_FUSED_OPS, NPU_MOE_PATCH, NPU_FLA)
    return Switches(kernels=kernels, npu={name: _flag(name) for name in names})
