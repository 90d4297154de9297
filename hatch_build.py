"""pip's view of the workspace: `pip install -e .` installs every distribution from this checkout.

uv never builds the root (`[tool.uv] package = false`) and finds the members through
`[tool.uv.sources]`. pip knows no sources: a bare `twinkle-kit` requirement sends it to PyPI,
where a different project of that name lives. So the root declares no dependencies of its own,
and this build hook adds each member as a direct reference to this checkout
(`twinkle-mesh @ file:///...`), which pip takes over any index for that name, also where another
member asks for it by name. It also fills the root's extras, declared empty in pyproject.toml so
that uv's lock does not see them, with the local twinkle-kit's extra of the same name.

pip installs a direct reference to a folder as a regular wheel. For an editable install of the
root the hook first builds each member's editable wheel (hatchling's, the one `uv sync`
installs) under build/editable-wheels/, so every distribution imports from its `src` folder.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface
from hatchling.builders.wheel import WheelBuilder

KIT = "twinkle-kit"
# The documents install `.[transformers,ray]`. Transformers is the default backend, so its
# extra adds nothing, but it must exist for pip to take the command without a warning.
DEFAULT_BACKEND_EXTRA = "transformers"
EDITABLE_WHEELS = Path("build") / "editable-wheels"


def read_pyproject(folder: Path) -> dict[str, Any]:
    with (folder / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def workspace_members(root: Path) -> dict[str, Path]:
    """Each member's distribution name and folder, from the root's uv workspace globs."""
    patterns = read_pyproject(root)["tool"]["uv"]["workspace"]["members"]
    found = {f for p in patterns for f in root.glob(p) if (f / "pyproject.toml").is_file()}
    return {read_pyproject(folder)["project"]["name"]: folder for folder in sorted(found)}


def root_extras(root: Path) -> list[str]:
    """The extras pip offers at the root: the local twinkle-kit's, plus the default backend's."""
    kit = read_pyproject(workspace_members(root)[KIT])["project"]
    return sorted({DEFAULT_BACKEND_EXTRA, *kit.get("optional-dependencies", {})})


def editable_wheel(folder: Path, out: Path) -> Path:
    """The member's editable wheel, built by this hatchling (every member's own backend)."""
    backend = read_pyproject(folder).get("build-system", {}).get("build-backend")
    if backend != "hatchling.build":
        raise ValueError(
            f"{folder} builds with {backend!r}; the root's editable install builds every "
            "member with hatchling: give it build-backend = 'hatchling.build'"
        )
    return Path(next(WheelBuilder(str(folder)).build(directory=str(out), versions=["editable"])))


def member_requirements(root: Path, editable: bool) -> list[str]:
    """Every member as a direct reference, and twinkle-kit's extras under the root's extras."""
    members = workspace_members(root)
    if editable:
        out = root / EDITABLE_WHEELS
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        uris = {name: editable_wheel(folder, out).as_uri() for name, folder in members.items()}
    else:
        uris = {name: folder.as_uri() for name, folder in members.items()}
    requirements = [f"{name} @ {uri}" for name, uri in uris.items()]
    for extra in root_extras(root):
        if extra != DEFAULT_BACKEND_EXTRA:
            requirements.append(f'{KIT}[{extra}] @ {uris[KIT]} ; extra == "{extra}"')
    return requirements


class WorkspaceRequirementsHook(BuildHookInterface):
    """Adds the members' direct references to the root wheel's metadata, which pip installs."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root).resolve()
        declared, offered = sorted(self.metadata.core.optional_dependencies), root_extras(root)
        if declared != offered:
            raise ValueError(
                f"the root pyproject.toml declares the extras {declared}, but pip's install "
                f"offers {offered} (twinkle-kit's extras and '{DEFAULT_BACKEND_EXTRA}'): list "
                "exactly those under [project.optional-dependencies], each empty"
            )
        build_data["dependencies"] += member_requirements(root, editable=version == "editable")
