"""Hardware layout: DeviceGroup (where components live), DeviceMesh (how they parallelize)."""

from twinkle.mesh.device_group import DeviceGroup, validate_device_groups
from twinkle.mesh.device_mesh import DeviceMesh
from twinkle.mesh.platform import Platform

__all__ = ["DeviceGroup", "DeviceMesh", "Platform", "validate_device_groups"]
