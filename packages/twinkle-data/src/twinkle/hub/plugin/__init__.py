"""Plugin: component classes from a hub repository or a local folder (the documents' "use
hub components"), loaded safely.

``Plugin.load_plugin('ms://org/repo')`` (or ``hf://org/repo``, ``org/repo@v1``, a folder)
fetches the repo through ``twinkle.hub`` (the local cache first; the snapshot it found is
its pinned revision), reads its ``twinkle_plugin.json``, hashes its files, imports its
module and returns ``{'ms://org/repo:MyLoss': MyLoss, ...}``. Those names then work
wherever a registered name does: ``set_loss('ms://org/repo:MyLoss')``,
``dataset.map('ms://org/repo:MyProcessor')``, ``set_template``, ``add_metric``, rewards,
advantages and samplers.

Code from a hub repo runs only with consent: ``trust_remote_code=True``, or
``TWINKLE_TRUST_REMOTE_CODE=1`` in the environment. The files' sha256 is logged at load,
``sha256=`` pins it, and files that hash otherwise are refused. A local folder is the
user's own code and needs no consent; it is hashed and pinnable all the same. A plugin
package imports its own modules relatively (``from . import helpers``).
"""

from __future__ import annotations

import os
from pathlib import Path

from twinkle.hub.plugin.files import digest, read_files
from twinkle.hub.plugin.loader import TRUST_ENV, LoadedPlugin, load, locate
from twinkle.hub.plugin.manifest import MANIFEST, PluginError
from twinkle.hub.plugin.reference import is_reference, resolve_component, split_reference


class Plugin:
    """Load hub components; see the module docstring."""

    @staticmethod
    def load_plugin(
        source: str | os.PathLike[str],
        revision: str | None = None,
        *,
        sha256: str | None = None,
        trust_remote_code: bool | None = None,
    ) -> dict[str, type]:
        """The component classes ``source`` declares, by their namespaced names.

        ``trust_remote_code`` None means ``TWINKLE_TRUST_REMOTE_CODE``. Raises PluginError
        (a ValueError) naming the repo and the cause for a repo that cannot be fetched or
        is no plugin, a bad pin or a changed hash, missing consent, or a failed import.
        """
        plugin = load(locate(source, revision), sha256, trust_remote_code)
        return {plugin.name(name): cls for name, cls in plugin.components.items()}


def plugin_sha256(folder: str | os.PathLike[str]) -> str:
    """The sha256 ``load_plugin`` would log for the plugin checked out at ``folder``."""
    return digest(read_files(Path(folder), str(folder)))


__all__ = [
    "MANIFEST",
    "TRUST_ENV",
    "LoadedPlugin",
    "Plugin",
    "PluginError",
    "is_reference",
    "plugin_sha256",
    "resolve_component",
    "split_reference",
]
