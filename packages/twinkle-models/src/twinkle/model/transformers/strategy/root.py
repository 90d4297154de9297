"""ForwardRoot: the one module every forward of a strategy-wrapped model runs through.

DDP prepares its gradient reduction in its own ``forward``, and FSDP2 gathers the
root's parameters (embeddings, final norm, the head) in a hook on the root's
``forward``. The model wrapper runs more than ``model(**inputs)``: the decoder alone
followed by a chunked head, or the backbone of an embedding model. Running each of
those as a callable inside ``ForwardRoot.forward`` gives every path the wrapper's
hooks, so no path can skip the gradient synchronisation or find a parameter sharded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn


class ForwardRoot(nn.Module):
    """Holds the model as ``module`` and runs ``fn(*args, **kwargs)`` as its forward."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.module = model

    def forward(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)
