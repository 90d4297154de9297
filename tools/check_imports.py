"""Fail when a distribution imports from one it must not depend on (DESIGN.md §1).

Reads every import statement (module-level or inside functions) of every
package's sources and tests, maps the imported module to the distribution
that owns it, and prints ``file:line`` for each import that breaks the
one-way rule, or a pyproject that declares such a dependency.

Usage: python tools/check_imports.py [ROOT]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from workspace import (  # noqa: E402
    ALLOWED_DEPENDENCIES,
    distributions,
    owned_modules,
    workspace_dependencies,
)


def imported_modules(tree: ast.AST):
    """(line, dotted module) for every absolute import in a parsed file."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
            for alias in node.names:  # `from twinkle import dataset` imports a subpackage
                yield node.lineno, f"{node.module}.{alias.name}"


def owner_of(module: str, owners: dict[str, str]) -> str | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in owners:
            return owners[".".join(parts[:n])]
    return None


def violations(root: Path) -> list[str]:
    owners = owned_modules(root)
    problems = []
    for dist, folder in distributions(root).items():
        allowed = ALLOWED_DEPENDENCIES.get(dist)
        if allowed is None:
            problems.append(f"{folder}: {dist} is not in the layering table of tools/workspace.py")
            continue
        for bad in sorted(workspace_dependencies(root, dist) - allowed):
            problems.append(f"{folder / 'pyproject.toml'}: {dist} must not depend on {bad}")
        for path in sorted(folder.rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for line, module in imported_modules(tree):
                target = owner_of(module, owners)
                if target and target != dist and target not in allowed:
                    problems.append(
                        f"{path.relative_to(root)}:{line}: {dist} imports {module} "
                        f"(from {target}), which it must not depend on"
                    )
    return sorted(set(problems))


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).parents[1]).resolve()
    problems = violations(root)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} layering violation(s); see DESIGN.md §1 for the rule.")
        return 1
    print(f"layering ok: {len(distributions(root))} distributions checked")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
