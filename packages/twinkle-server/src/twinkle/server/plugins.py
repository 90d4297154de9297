"""The operator's plugin allow-list: the hub components tenants may name, pinned.

Losses run on the server, so a tenant's own loss is code the operator must allow. The
operator reviews a plugin repo, names its components in the allow-list of their kind, and
pins the repo under ``allow.plugins`` (its id, revision and the sha256 its load logs, or
``twinkle.hub.plugin.plugin_sha256(checkout)``)::

    allow:
      losses: [CrossEntropyLoss, GRPOLoss, "ms://org/repo:MyLoss"]
      preprocessors: [SelfCognitionProcessor, "ms://org/repo:MyProcessor"]
      plugins:
        - {id: "ms://org/repo", revision: "v1.0", sha256: "3b0c...e9"}

The server loads each pinned plugin once, at start (``load_allowed_plugins``; in ``mode:
ray`` also in every worker of the device groups, ``load_plugins_on_groups``), and every
tenant shares it; files that hash otherwise stop the start. A tenant naming a component
that is not listed gets a 403 naming the allow-list (``not_allowed``).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from twinkle.hub.plugin import Plugin, is_reference, split_reference
from twinkle.infra import remote_class
from twinkle.server.errors import Forbidden

COMPONENT_LISTS = ("losses", "optimizers", "lr_schedulers", "templates", "preprocessors")
"""The allow-lists that may name plugin components as ``id:ClassName``."""


class AllowedPlugin(BaseModel):
    """A plugin repo the operator reviewed; the server loads exactly these files."""

    model_config = ConfigDict(extra="forbid")

    id: str
    """As the components name it: ``ms://org/repo``, ``hf://org/repo`` or a folder."""
    revision: str | None = None
    """The reviewed revision (a tag or commit); required for a hub id."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The reviewed files' hash, as the plugin's load logs it."""


def plugin_list_problems(allow: Any) -> list[str]:
    """Mistakes in ``allow`` (an AllowList): a component of an unpinned plugin, a plugin
    pinned twice, a hub plugin without a revision. Checked as the config is read."""
    ids = [plugin.id for plugin in allow.plugins]
    problems = [
        f"allow.plugins: {i!r} is listed twice" for i in sorted(set(ids)) if ids.count(i) > 1
    ]
    problems += [
        f"allow.plugins: {plugin.id!r} needs a revision (the one reviewed): a hub repo moves"
        for plugin in allow.plugins
        if "://" in plugin.id and "@" not in plugin.id and plugin.revision is None
    ]
    for what in COMPONENT_LISTS:
        for name in getattr(allow, what):
            if is_reference(name) and split_reference(name)[0] not in ids:
                problems.append(
                    f"allow.{what}: {name!r} is a plugin component, but its plugin "
                    f"{split_reference(name)[0]!r} is not pinned under allow.plugins "
                    "(add its id, revision and sha256)"
                )
    return problems


def load_allowed_plugins(plugins: list[AllowedPlugin]) -> list[str]:
    """Load every pinned plugin into this process (once: a loaded one is kept); the
    problems, one per plugin that cannot be loaded as pinned."""
    problems = []
    for index, plugin in enumerate(plugins):
        try:
            Plugin.load_plugin(
                plugin.id, plugin.revision, sha256=plugin.sha256, trust_remote_code=True
            )
        except (ValueError, OSError) as error:
            problems.append(f"allow.plugins[{index}] ({plugin.id}): {error}")
    return problems


@remote_class(execute="all")
class WorkerPlugins:
    """The pinned plugins, loaded in every worker of a Ray device group (``mode: ray``): the
    model resolves a tenant's ``id:ClassName`` in the worker it runs in, and a worker
    process never loads plugin code on its own (it has no consent to)."""

    def __init__(self, plugins: list[dict[str, Any]]) -> None:
        pins = [AllowedPlugin.model_validate(plugin) for plugin in plugins]
        problems = load_allowed_plugins(pins)
        if problems:
            raise ValueError("; ".join(problems))


def load_plugins_on_groups(plugins: list[AllowedPlugin], groups: list[str]) -> None:
    """Load the pinned plugins on every worker of ``groups`` (before the components that
    resolve names are built there); a worker that cannot load them stops the start."""
    if plugins:
        pins = [plugin.model_dump() for plugin in plugins]
        for group in groups:
            WorkerPlugins(pins, remote_group=group)


def unresolved(names: list[str], registry: Any) -> list[str]:
    """The names of one allow-list that ``registry`` cannot give: unknown plain names, and
    plugin components that are missing or of another kind (their plugins loaded first)."""
    problems = []
    for name in names:
        if not is_reference(name):
            if name not in registry:
                problems.append(f"unknown name {name!r}")
            continue
        try:
            registry.get(name)
        except (ValueError, TypeError) as error:
            problems.append(str(error))
    return problems


def not_allowed(name: str, allowed: list[str], what: str) -> Forbidden:
    """The 403 for a plugin component the operator did not allow."""
    return Forbidden(
        f"{what} {name!r} is a plugin component this server does not allow; its {what} "
        f"allow-list holds: {', '.join(allowed)}. Ask the operator to review the plugin and "
        "list it (allow.plugins pins the repo)"
    )
