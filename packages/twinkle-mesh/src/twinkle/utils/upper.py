"""Reach a module of a distribution to the right of twinkle-mesh, only when a caller asks.

twinkle-mesh never imports its dependents (DESIGN.md §1), yet two of its names lead into
them: ``from twinkle import Plugin`` and a registry given a hub component
(``'ms://org/repo:MyLoss'``). Both come here, at call time, so the layering holds for
every install and a missing distribution is an ImportError that says what to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def import_upper(module: str, distribution: str, why: str) -> ModuleType:
    """``module`` imported now; ``why`` (what the caller wanted) goes into the error."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is None or not (module + ".").startswith(error.name + "."):
            raise  # the module exists but something it imports is missing: say that instead
        raise ImportError(
            f"{why} needs {module}, from the {distribution} distribution: "
            f"pip install {distribution}"
        ) from error
