"""``twinkle_plugin.json``: what a plugin repository declares, read without running its code.

A plugin repository holds, at its root::

    {"module": "my_plugin.py", "components": ["MyLoss", "MyProcessor"]}

``module`` is the Python file (or package folder with an ``__init__.py``) to import,
relative to the root; ``components`` are the classes it defines for Twinkle to use. Because
the manifest is plain JSON, an error can list what a repo provides before any of its code
has been trusted or run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MANIFEST = "twinkle_plugin.json"


class PluginError(ValueError):
    """A plugin cannot be used: not a plugin, bad manifest, refused, or failed to import."""


@dataclass(frozen=True)
class Manifest:
    module: PurePosixPath
    components: tuple[str, ...]


def read_manifest(folder: Path, source: str) -> Manifest:
    """The checked manifest of the repo at ``folder`` (``source`` names it in errors)."""
    path = folder / MANIFEST
    if not path.is_file():
        raise PluginError(
            f"{source} is not a Twinkle plugin: it has no {MANIFEST} at its root; a plugin "
            'repo declares {"module": "file.py", "components": ["ClassName", ...]} there'
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PluginError(f"{source}: {MANIFEST} is not valid JSON ({error})") from None
    if not isinstance(data, dict) or set(data) != {"module", "components"}:
        raise PluginError(
            f"{source}: {MANIFEST} must be an object with exactly the keys 'module' and "
            f"'components', got {data!r}"
        )
    return Manifest(
        _module(data["module"], folder, source), _components(data["components"], source)
    )


def _module(value: object, folder: Path, source: str) -> PurePosixPath:
    where = f"{source}: {MANIFEST} 'module'"
    if not isinstance(value, str) or not value:
        raise PluginError(f"{where} must be a relative path to a .py file or package folder")
    module = PurePosixPath(value)
    if module.is_absolute() or ".." in module.parts:
        raise PluginError(f"{where} {value!r} must stay inside the repo (no '/' or '..' at start)")
    target = folder / module
    if not (target.suffix == ".py" and target.is_file()) and not (target / "__init__.py").is_file():
        raise PluginError(
            f"{where} {value!r} is neither a .py file nor a folder with an __init__.py in the repo"
        )
    return module


def _components(value: object, source: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise PluginError(f"{source}: {MANIFEST} 'components' must be a non-empty list of names")
    bad = [name for name in value if not (isinstance(name, str) and name.isidentifier())]
    if bad:
        raise PluginError(f"{source}: {MANIFEST} 'components' holds non-class names {bad!r}")
    if len(set(value)) != len(value):
        raise PluginError(f"{source}: {MANIFEST} 'components' lists a name twice: {value!r}")
    return tuple(value)
