"""Twinkle: components for training large language models in a loop the user owns.

This top-level package belongs to the twinkle-mesh distribution. The other
distributions (twinkle-data, twinkle-models, ...) ship subpackages of
``twinkle`` without an ``__init__`` of their own; extending ``__path__`` lets
Python find them both in wheels and in editable workspace installs, where each
distribution's ``src`` folder is a separate entry of ``sys.path``.

Importing ``twinkle`` stays cheap and never imports torch or ray.
"""

# Written in the form static readers (griffe, for the API reference) know as a pkgutil namespace.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

__version__ = "0.1.0"

from twinkle.infra import (  # noqa: E402  (after __path__ is extended)
    get_device_placement,
    initialize,
    remote_class,
    remote_function,
)
from twinkle.mesh import DeviceGroup, DeviceMesh, Platform  # noqa: E402
from twinkle.utils import get_logger  # noqa: E402
from twinkle.utils.tinker_env import init_tinker_client  # noqa: E402
from twinkle.utils.upper import import_upper  # noqa: E402

# Names the user imports from ``twinkle`` that another distribution ships: (module, distribution).
_UPPER_NAMES = {"Plugin": ("twinkle.hub.plugin", "twinkle-data")}


def __getattr__(name: str) -> object:
    if name not in _UPPER_NAMES:
        raise AttributeError(f"module 'twinkle' has no attribute {name!r}")
    module, distribution = _UPPER_NAMES[name]
    return getattr(import_upper(module, distribution, f"twinkle.{name}"), name)


__all__ = [
    "DeviceGroup",
    "DeviceMesh",
    "Platform",
    "get_device_placement",
    "get_logger",
    "init_tinker_client",
    "initialize",
    "remote_class",
    "remote_function",
]
