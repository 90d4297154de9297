"""What the ``datasets`` cache key of a step must include beyond what ``datasets`` hashes.

``datasets`` fingerprints a step by pickling its function, and pickling records a class
imported from a module by its name alone. So after an edit to a preprocessor class that
lives in a module (not in the script being run), the same pipeline would be served the
rows the old code wrote. The transforms therefore carry a hash of the code of their
component's class, and the storage format version of this package.
"""

from __future__ import annotations

import types
from collections.abc import Iterator

from datasets.fingerprint import Hasher

from twinkle.preprocessor import Filter, Preprocessor

STORAGE_FORMAT = 2
"""Bump when the stored rows or the transforms change, so old caches are not reused."""


def code_fingerprint(component: object) -> str:
    """A hash of the code of every method ``component``'s class defines or inherits, of any
    function stored on the component (a wrapped ``row -> Trajectory`` function), and of any
    preprocessor or filter it holds (``AutoPreprocessor`` delegates to the built-ins)."""
    # Only entries that hold code count: pickling adds others (``__slotnames__``) later.
    parts: list[str | bytes] = []
    namespaces = [vars(cls) for cls in type(component).__mro__[:-1]]  # all but object
    for namespace in [*namespaces, getattr(component, "__dict__", {})]:
        for name, value in sorted(namespace.items()):
            if isinstance(value, Preprocessor | Filter):
                parts += [name, code_fingerprint(value)]
                continue
            code = list(_code_of(getattr(value, "__func__", value)))
            if code:
                parts += [name, *code]
    return Hasher.hash(parts)


def _code_of(value: object) -> Iterator[str | bytes]:
    code = getattr(value, "__code__", None)
    if isinstance(code, types.CodeType):
        yield from _code_parts(code)


def _code_parts(code: types.CodeType) -> Iterator[str | bytes]:
    """The bytecode, names and constants of ``code`` and of the code nested in it, in a form
    that does not depend on the process (unlike ``marshal``, or a frozenset's order)."""
    yield code.co_code
    yield repr(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_parts(const)
        elif isinstance(const, frozenset):
            yield repr(sorted(map(repr, const)))
        else:
            yield repr(const)
