"""The one place that imports megatron-core, so a missing extra fails with a clear message."""

from __future__ import annotations

INSTALL_HINT = "install the extra: pip install 'twinkle-models[megatron]' (megatron-core 0.16)"


def require_megatron() -> None:
    """Raise an ImportError naming the extra to install when megatron-core is missing."""
    try:
        import megatron.core  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"MegatronModel needs megatron-core: {INSTALL_HINT}") from exc
