"""The errors a Template raises for a trajectory it cannot encode."""

from __future__ import annotations


class EncodeError(ValueError):
    """A trajectory cannot be encoded. ``index`` is its position in the list given to
    ``batch_encode`` (0 for ``encode``), so a Dataset can name the row it came from."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(f"trajectory {index}: {message}")
        self.index = index
        self.reason = message


class HistoryMismatchError(EncodeError):
    """A trained assistant turn renders differently in the whole conversation than in the
    conversation cut right after it (the chat template rewrites earlier turns)."""
