"""Remote components for the dunder tests: a remote ``__getitem__``/``__len__``, and a
subclass that overrides remote methods without decorating them again.

Importable by the Ray workers: the tests put this folder on their PYTHONPATH.
"""

from __future__ import annotations

import torch.distributed as dist

from twinkle import remote_class, remote_function


@remote_class(execute="first")
class Table:
    """Rows on the group's first worker."""

    def __init__(self, rows: list) -> None:
        self.rows = list(rows)

    @remote_function(dispatch="all", execute="first", collect="first")
    def __len__(self) -> int:
        return len(self.rows)

    @remote_function(dispatch="all", execute="first", collect="first")
    def __getitem__(self, index: int):
        return self.rows[index]

    @remote_function(dispatch="slice", collect="flatten")
    def __call__(self, items: list) -> list:
        return [(item, "base") for item in items]


class UpperTable(Table):
    """Overrides without decorators: the specs of Table's methods apply."""

    def __getitem__(self, index: int):
        return str(self.rows[index]).upper()

    def __call__(self, items: list) -> list:
        return [(item, "sub", dist.get_rank()) for item in items]


@remote_class(execute="all")
class SpreadTable(UpperTable):
    """The same, built on every worker: ``__call__`` slices over them."""
