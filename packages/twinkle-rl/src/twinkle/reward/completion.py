"""Reading a trajectory the way every reward does: the completion is the content of the last
assistant message, the ground truth the first dict of ``user_data``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def completion_text(trajectory: Any) -> str:
    """The last assistant message's text ('' when the trajectory has no assistant turn)."""
    for message in reversed(trajectory.get("messages") or []):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, str):
                return content
            return "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return ""


def ground_truth(trajectory: Any, key: str, owner: str) -> Any:
    """``user_data[0][key]``, or an error naming the preprocessor that stores it."""
    user_data = trajectory.get("user_data") or []
    data = user_data[0] if user_data and isinstance(user_data[0], Mapping) else {}
    if key not in data:
        raise ValueError(
            f"{owner} reads the ground truth from user_data[0][{key!r}], which this trajectory "
            f"lacks (user_data={user_data!r}); build the prompts with the matching "
            "preprocessor (GSM8KProcessor stores 'answer', CountdownProcessor 'target' and "
            "'nums')"
        )
    return data[key]
