"""twinkle.infra.ray keeps the one-way layering its __init__ docstring declares.

Read from the sources with ast (as tools/check_imports.py reads the workspace), so
function-local imports count too and no module is imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import twinkle.infra

INFRA = Path(twinkle.infra.__file__).parent
RAY = INFRA / "ray"
PACKAGE = "twinkle.infra.ray"
_LAYER = re.compile(r"^(\d+)\.\s+((?:``\w+``,?\s*)+):", re.MULTILINE)


def declared_layers() -> dict[str, int]:
    """Module name -> layer number, from the numbered list of the subpackage's docstring."""
    doc = ast.get_docstring(ast.parse((RAY / "__init__.py").read_text())) or ""
    layers = {}
    for number, names in _LAYER.findall(doc):
        for name in re.findall(r"``(\w+)``", names):
            layers[name] = int(number)
    return layers


def imports_of(path: Path, package: str) -> list[tuple[int, str, bool]]:
    """(line, absolute module, at module level) for every import in a file of ``package``;
    ``from a import b`` yields ``a.b`` too, since b may be a submodule."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the file's package, one level up per extra dot
                base = package.rsplit(".", node.level - 1)[0]
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module, id(node) in top_level))
            found += [
                (node.lineno, f"{module}.{a.name}", id(node) in top_level) for a in node.names
            ]
    return found


def sibling(module: str) -> str | None:
    """The subpackage's module that ``module`` names, if any."""
    if module.startswith(PACKAGE + "."):
        return module[len(PACKAGE) + 1 :].split(".")[0]
    return None


def layering_violations(layers: dict[str, int], imports: dict[str, list]) -> list[str]:
    """Each import of a module of the same or a higher layer, as ``module:line -> target``."""
    problems = []
    for name, found in sorted(imports.items()):
        for line, module, _ in found:
            target = sibling(module)
            if target is not None and target in layers and layers[target] >= layers[name]:
                problems.append(
                    f"{name}:{line} imports {target} (layer {layers[target]} >= {layers[name]})"
                )
    return problems


def ray_modules() -> dict[str, list]:
    return {
        p.stem: imports_of(p, PACKAGE) for p in sorted(RAY.glob("*.py")) if p.stem != "__init__"
    }


def test_every_module_of_the_subpackage_has_a_declared_layer():
    layers = declared_layers()
    assert len(set(layers.values())) >= 5, f"the docstring's layer list was not read: {layers}"
    assert sorted(layers) == sorted(ray_modules())


def test_each_module_imports_only_modules_of_lower_layers():
    assert layering_violations(declared_layers(), ray_modules()) == []


def test_a_cycle_or_an_import_upwards_is_reported():
    """The check itself can fail: a function-local import of a higher layer (how the old
    ray_lazy reached ray_component) is one violation, a same-layer pair both ways two."""
    layers = {"errors": 1, "env": 1, "lazy": 3, "component": 7}
    upward = {"lazy": [(10, "twinkle.infra.ray.component", False)], "component": []}
    assert layering_violations(layers, upward) == ["lazy:10 imports component (layer 7 >= 3)"]
    pair = {
        "errors": [(1, "twinkle.infra.ray.env", True)],
        "env": [(2, "twinkle.infra.ray.errors", True)],
    }
    assert len(layering_violations(layers, pair)) == 2


def test_the_pure_layer_imports_no_ray():
    """twinkle.infra re-exports layer 1's errors: importing it must not need the ray extra."""
    layers = declared_layers()
    for name, found in ray_modules().items():
        if layers[name] == 1:
            assert [m for _, m, _ in found if m == "ray" or m.startswith("ray.")] == [], name


def test_the_rest_of_infra_imports_only_the_pure_layer_at_module_level():
    layers = declared_layers()
    for path in sorted(INFRA.glob("*.py")):
        for line, module, top in imports_of(path, "twinkle.infra"):
            target = sibling(module)
            if top and target is not None:
                assert layers[target] == 1, f"{path.name}:{line} imports {module} at the top"
