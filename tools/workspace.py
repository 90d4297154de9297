"""What the workspace is made of: distributions, the import packages each owns, their layering.

Shared by the layering check and the wheel import check, so both read the
package layout from the source tree instead of keeping lists of their own.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

# DESIGN.md §1: dependencies point one way (mesh <- data <- models <- rl <- server,
# kernels <- models, mesh <- client); a distribution may import only itself and these.
ALLOWED_DEPENDENCIES = {
    "twinkle-mesh": set(),
    "twinkle-data": {"twinkle-mesh"},
    "twinkle-kernels": {"twinkle-mesh"},
    "twinkle-models": {"twinkle-mesh", "twinkle-data", "twinkle-kernels"},
    "twinkle-rl": {"twinkle-mesh", "twinkle-data", "twinkle-kernels", "twinkle-models"},
    "twinkle-server": {
        "twinkle-mesh",
        "twinkle-data",
        "twinkle-kernels",
        "twinkle-models",
        "twinkle-rl",
    },
    "twinkle-client": {"twinkle-mesh"},
    "twinkle-kit": {
        "twinkle-mesh",
        "twinkle-data",
        "twinkle-kernels",
        "twinkle-models",
        "twinkle-rl",
        "twinkle-server",
        "twinkle-client",
    },
}


def distributions(root: Path) -> dict[str, Path]:
    """Distribution name -> its folder, for every workspace member."""
    found = {}
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        name = tomllib.loads(pyproject.read_text())["project"]["name"]
        found[name] = pyproject.parent
    return found


def owned_modules(root: Path) -> dict[str, str]:
    """Import package name -> owning distribution (``twinkle.dataset`` -> ``twinkle-data``)."""
    owners = {}
    for dist, folder in distributions(root).items():
        src = folder / "src"
        for init in sorted(src.glob("*/__init__.py")):
            owners[init.parent.name] = dist
        for init in sorted(src.glob("twinkle/*/__init__.py")):
            owners[f"twinkle.{init.parent.name}"] = dist
    return owners


def workspace_dependencies(root: Path, dist: str) -> set[str]:
    """The workspace members a distribution declares it depends on (extras included)."""
    project = tomllib.loads((distributions(root)[dist] / "pyproject.toml").read_text())["project"]
    declared = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        declared += extra
    members = set(distributions(root))
    names = {_requirement_name(r) for r in declared}
    return names & members


def _requirement_name(requirement: str) -> str:
    name = requirement
    for stop in "[<>=!~; ":
        name = name.split(stop)[0]
    return name.strip().lower()
