"""``source:ClassName``: the one place a component name that points into a plugin resolves.

Every registry (losses, metrics, templates, preprocessors, rewards, advantages, samplers,
...) sends a name it does not hold and that has a ``:`` here, so ``set_loss``,
``dataset.map``, ``set_template``, ``add_metric`` and the rest accept the same names and
refuse them with the same errors.
"""

from __future__ import annotations

from twinkle.hub.plugin.loader import LoadedPlugin, canonical_source, load, loaded, locate
from twinkle.hub.plugin.manifest import PluginError

FORM = "source:ClassName (ms://org/repo:MyLoss, hf://org/repo@v1:MyLoss, /path/to/folder:MyLoss)"


def is_reference(name: str) -> bool:
    """Whether ``name`` has the ``source:ClassName`` form (``bundled://gsm8k`` has not)."""
    source, _, class_name = name.rpartition(":")
    return bool(source) and class_name.isidentifier()


def split_reference(reference: str) -> tuple[str, str]:
    """``('ms://org/repo', 'MyLoss')`` from ``'ms://org/repo:MyLoss'``."""
    source, _, class_name = reference.rpartition(":")
    if class_name.startswith("//"):  # the only ':' is the scheme's
        raise PluginError(f"{reference!r} names a repo but no class: write {reference}:ClassName")
    if not source or not class_name.isidentifier():
        raise PluginError(f"a plugin component is written {FORM}; got {reference!r}")
    return source, class_name


def resolve_component(reference: str, kind: str, base: type | None = None) -> type:
    """The class ``reference`` names, loading its plugin first when this process has not.

    A hub plugin loads here only with consent (``TWINKLE_TRUST_REMOTE_CODE=1``); otherwise
    load it first with ``Plugin.load_plugin(..., trust_remote_code=True, sha256=...)``. A
    class the repo does not declare is a ValueError listing what it provides (read from its
    manifest, before any of its code runs); one that is not a ``base`` is a TypeError.
    """
    source, class_name = split_reference(reference)
    _, hub_id = canonical_source(source)
    plugin = loaded(source)
    if plugin is None or (hub_id is not None and hub_id.revision not in (None, plugin.revision)):
        located = locate(source)
        if class_name not in located.manifest.components:
            raise _unknown(reference, kind, located.source, located.manifest.components)
        plugin = load(located)
    if class_name not in plugin.components:
        raise _unknown(reference, kind, plugin.source, tuple(plugin.components))
    cls = plugin.components[class_name]
    if base is not None and not issubclass(cls, base):
        article = "an" if kind[:1] in "aeiou" else "a"
        raise TypeError(
            f"{reference!r} is not {article} {kind}: {class_name} subclasses "
            f"{', '.join(b.__qualname__ for b in cls.__mro__[1:-1]) or 'object'}, and "
            f"{article} {kind} must subclass {base.__qualname__}; {plugin.source}'s {kind} "
            f"components: {', '.join(_of_kind(plugin, base)) or '(none)'}"
        )
    return cls


def _unknown(reference: str, kind: str, source: str, provided: tuple[str, ...]) -> PluginError:
    return PluginError(
        f"unknown {kind} {reference!r}: {source} provides {', '.join(provided)} "
        f"(as {source}:ClassName)"
    )


def _of_kind(plugin: LoadedPlugin, base: type) -> list[str]:
    return [name for name, cls in plugin.components.items() if issubclass(cls, base)]
