"""Import every package the workspace ships, as an installed user would.

Usage: python tools/import_all.py ROOT [--from-site-packages] [--only=dist,dist] [--no-torch]

--from-site-packages  each module must come from the installed wheels, not the source tree
--only                check only the packages of these distributions
--no-torch            torch must be neither installed nor imported (the laptop client)
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from workspace import owned_modules  # noqa: E402


def main(argv: list[str]) -> int:
    root = Path(argv[1]).resolve()
    flags = argv[2:]
    only = next((f.split("=", 1)[1].split(",") for f in flags if f.startswith("--only=")), None)
    sys.path.remove(str(Path(__file__).parent))  # tools/ must not be importable as a package
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    modules = sorted(m for m, dist in owned_modules(root).items() if only is None or dist in only)
    if only is None or "twinkle-mesh" in only:
        modules.insert(0, "twinkle")
    failures = []
    for name in modules:
        module = importlib.import_module(name)
        origin = Path(module.__file__).resolve()
        if "--from-site-packages" in flags and not origin.is_relative_to(site):
            failures.append(f"{name} was imported from {origin}, not from {site}")
    if "--no-torch" in flags:
        if importlib.util.find_spec("torch") is not None:
            failures.append("torch is installed, but this environment must work without it")
        if "torch" in sys.modules:
            failures.append("importing the packages imported torch")
    for failure in failures:
        print(failure)
    print(f"imported {len(modules)} packages; {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
