"""Load a plugin: fetch its repo (cache first), hash its files, ask for consent, import it.

A process holds one version of each plugin, keyed by its canonical source (``ms://org/repo``,
``hf://org/repo``, or a folder's absolute path). Loading it again returns the same classes
when its files still hash the same, and is refused when they changed: code that is already
running is never swapped, and never silently left different from what is on disk.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import ModuleType

from twinkle.hub.ids import BundledId, HubId, parse_id
from twinkle.hub.plugin.files import digest, private_copy, read_files
from twinkle.hub.plugin.manifest import MANIFEST, Manifest, PluginError, read_manifest
from twinkle.hub.remote import _TRUE, HubError, fetch_snapshot
from twinkle.utils import get_logger

TRUST_ENV = "TWINKLE_TRUST_REMOTE_CODE"

logger = get_logger(__name__)


@dataclass(frozen=True)
class Located:
    """A plugin repo on disk whose code has not run: its source, snapshot and manifest."""

    source: str
    """Canonical: ``ms://org/repo``, ``hf://org/repo`` or an absolute folder path."""
    from_hub: bool
    revision: str | None
    """The snapshot found (a commit or tag), or None for a local folder."""
    folder: Path
    manifest: Manifest


@dataclass(frozen=True)
class LoadedPlugin:
    """A plugin this process runs: where from, which files (``sha256``), and its classes."""

    source: str
    revision: str | None
    sha256: str
    components: dict[str, type]

    def name(self, class_name: str) -> str:
        """The namespaced name registries accept: ``ms://org/repo:MyLoss``."""
        return f"{self.source}:{class_name}"


_LOADED: dict[str, LoadedPlugin] = {}
_LOCK = threading.Lock()


def canonical_source(source: str | os.PathLike[str]) -> tuple[str, HubId | None]:
    """The key a plugin is held under, and its hub id (None for a local folder)."""
    parsed = parse_id(source)
    if isinstance(parsed, BundledId):
        raise PluginError(f"{source!r}: bundled ids name models and data sets, not plugins")
    if isinstance(parsed, HubId):
        return f"{parsed.hub}://{parsed.repo_id}", parsed
    return str(parsed.path), None


def loaded(source: str | os.PathLike[str]) -> LoadedPlugin | None:
    """The plugin this process holds for ``source``, if any (nothing is fetched)."""
    return _LOADED.get(canonical_source(source)[0])


def locate(source: str | os.PathLike[str], revision: str | None = None) -> Located:
    """The plugin's files on disk (a hub repo from the cache first, else downloaded)."""
    key, hub_id = canonical_source(source)
    if hub_id is None:
        folder = Path(key)
        if not folder.is_dir():
            raise PluginError(f"{source!r} is a file; a plugin is a folder holding {MANIFEST}")
        return Located(key, False, None, folder, read_manifest(folder, key))
    if revision is not None:
        hub_id = parse_id(str(hub_id), revision)
    try:
        folder = fetch_snapshot(hub_id, "model")
    except HubError as error:
        raise PluginError(f"cannot load plugin {str(hub_id)!r}: {error}") from error
    snapshot = folder.name if folder.parent.name == "snapshots" else hub_id.revision
    return Located(key, True, snapshot, folder, read_manifest(folder, key))


def load(
    located: Located, sha256: str | None = None, trust_remote_code: bool | None = None
) -> LoadedPlugin:
    """Hash ``located``'s files, check the pin and the consent, import it once per process."""
    pin = _checked_pin(sha256)
    files = read_files(located.folder, located.source)
    actual = digest(files)
    where = located.source + (f" at revision {located.revision}" if located.revision else "")
    if pin is not None and pin != actual:
        raise PluginError(
            f"{where}: its files hash to sha256={actual}, not the pinned sha256={pin}; the "
            "repo changed since it was reviewed (review it again and update the pin), or the "
            "pin names another revision"
        )
    with _LOCK:
        held = _LOADED.get(located.source)
        if held is not None:
            if held.sha256 != actual:
                raise PluginError(
                    f"{where}: this process already runs it with sha256={held.sha256}, and its "
                    f"files now hash to sha256={actual}; a changed plugin is refused (restart "
                    "the process to load the new files)"
                )
            return held
        if located.from_hub and not _trusted(trust_remote_code):
            raise PluginError(
                f"{where} holds Python code ({located.manifest.module}; it provides "
                f"{', '.join(located.manifest.components)}), and Twinkle runs code from a hub "
                f"repo only with consent: review it, then pass trust_remote_code=True and pin "
                f"what you reviewed with sha256='{actual}' (Plugin.load_plugin"
                f"({located.source!r}, trust_remote_code=True, sha256=...)), or set "
                f"{TRUST_ENV}=1"
            )
        plugin = _import(located, files, actual)
        _LOADED[located.source] = plugin
    logger.info(
        "loaded plugin %s (sha256=%s): %s", where, actual, ", ".join(located.manifest.components)
    )
    return plugin


def _checked_pin(sha256: str | None) -> str | None:
    if sha256 is None:
        return None
    pin = sha256.strip().lower() if isinstance(sha256, str) else ""
    if len(pin) != 64 or any(c not in "0123456789abcdef" for c in pin):
        raise PluginError(
            f"sha256= must be the 64 hex digits the plugin's load logged, got {sha256!r}"
        )
    return pin


def _trusted(trust_remote_code: bool | None) -> bool:
    if trust_remote_code is not None:
        return bool(trust_remote_code)
    return os.environ.get(TRUST_ENV, "").strip().lower() in _TRUE


def _import(located: Located, files: dict[str, bytes], sha256: str) -> LoadedPlugin:
    """Import the manifest's module from a private copy of ``files``; on any failure nothing
    of it stays in ``sys.modules`` and nothing is registered."""
    key = hashlib.sha256(f"{located.source}\0{sha256}".encode()).hexdigest()[:16]
    name = f"_twinkle_plugin_{key}"
    module_path = located.manifest.module
    try:
        module = _exec(name, private_copy(files, sha256) / module_path)
        components = {c: _component(module, c, located) for c in located.manifest.components}
    except BaseException as error:
        for loaded_name in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded_name]
        if isinstance(error, PluginError) or not isinstance(error, Exception):
            raise
        hint = _import_hint(error, module_path)
        raise PluginError(
            f"{located.source}: importing its module {module_path} failed: "
            f"{type(error).__name__}: {error}{hint}"
        ) from error
    return LoadedPlugin(located.source, located.revision, sha256, components)


def _exec(name: str, target: Path) -> ModuleType:
    if target.suffix == ".py":
        spec = importlib.util.spec_from_file_location(name, target)
    else:
        init = target / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(target)]
        )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _component(module: ModuleType, class_name: str, located: Located) -> type:
    value = getattr(module, class_name, None)
    where = f"{located.source}: {MANIFEST} declares {class_name!r}, but"
    if value is None:
        raise PluginError(f"{where} its module {located.manifest.module} defines no {class_name}")
    if not isinstance(value, type):
        raise PluginError(
            f"{where} in {located.manifest.module} it is a {type(value).__name__} value, "
            "not a class"
        )
    return value


def _import_hint(error: Exception, module_path: PurePosixPath) -> str:
    own = module_path.with_suffix("").parts[0]
    if isinstance(error, ModuleNotFoundError) and (error.name or "").split(".")[0] == own:
        return f" (a plugin imports its own modules relatively: from . import ..., not {own})"
    return ""
