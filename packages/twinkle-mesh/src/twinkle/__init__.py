"""Twinkle: components for training large language models in a loop the user owns.

This top-level package belongs to the twinkle-mesh distribution. The other
distributions (twinkle-data, twinkle-models, ...) ship subpackages of
``twinkle`` without an ``__init__`` of their own; extending ``__path__`` lets
Python find them both in wheels and in editable workspace installs, where each
distribution's ``src`` folder is a separate entry of ``sys.path``.

Importing ``twinkle`` stays cheap and never imports torch or ray. Names that
live in other distributions (``init_tinker_client``) resolve on first use.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"

from twinkle.infra import (  # noqa: E402  (after __path__ is extended)
    get_device_placement,
    initialize,
    remote_class,
    remote_function,
)
from twinkle.mesh import DeviceGroup, DeviceMesh, Platform  # noqa: E402
from twinkle.utils import get_logger  # noqa: E402

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

# name -> (module, distribution that ships it)
_ELSEWHERE = {"init_tinker_client": ("twinkle_client", "twinkle-client")}


def __getattr__(name: str):
    if name not in _ELSEWHERE:
        raise AttributeError(f"module 'twinkle' has no attribute {name!r}")
    module_name, distribution = _ELSEWHERE[name]
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        raise ImportError(
            f"twinkle.{name} is provided by the {distribution} distribution, which is not "
            f"installed: pip install {distribution}"
        ) from exc
    if not hasattr(module, name):
        raise ImportError(
            f"twinkle.{name} is provided by the {distribution} distribution, but the installed "
            f"{module_name} has no {name}: pip install -U {distribution}"
        )
    return getattr(module, name)
