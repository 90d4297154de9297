"""Small shared helpers: the rank-aware logger, the name registry, and the mesh types the
user's documents import from here (``from twinkle.utils import DeviceMesh``)."""

from twinkle.mesh import DeviceGroup, DeviceMesh, Platform
from twinkle.utils.logger import get_logger
from twinkle.utils.registry import Registry

__all__ = ["DeviceGroup", "DeviceMesh", "Platform", "Registry", "get_logger"]
