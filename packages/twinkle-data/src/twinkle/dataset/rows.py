"""How rows are stored in Arrow at each stage, and how they come back out.

Arrow wants one schema per column, but conversations do not have one: ``content`` is a
string or a list of parts, tool-call ``arguments`` a string or a dict, and ``user_data``
dicts have different keys in different datasets. So ``messages``, ``tools`` and
``user_data`` are stored as JSON strings (arrays as typed lists) and decoded on access;
they round-trip exactly, and datasets with different ``user_data`` keys can be mixed.

Two hidden columns record where each row came from, the source dataset and the row's
index in it, so an error can name both even after slicing, filtering or mixing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import datasets

from twinkle.data_format import InputFeature, Trajectory, from_jsonable, to_jsonable

SOURCE = "__twinkle_source__"
ROW = "__twinkle_row__"
HIDDEN = (SOURCE, ROW)
JSON_COLUMNS = ("messages", "tools", "user_data")
TOKEN_COLUMNS = ("input_ids", "labels", "position_ids", "attention_mask")

RAW, TRAJECTORY, ENCODED, PACKED = "raw", "trajectory", "encoded", "packed"
"""The stages of a dataset: rows as loaded, Trajectories after ``map``, InputFeatures after
``encode``, packed InputFeatures after ``pack_dataset``."""

_ORIGIN_FEATURES = {SOURCE: datasets.Value("string"), ROW: datasets.Value("int64")}
_JSON_FEATURES = {name: datasets.Value("string") for name in JSON_COLUMNS}
TRAJECTORY_FEATURES = datasets.Features({**_JSON_FEATURES, **_ORIGIN_FEATURES})
ENCODED_FEATURES = datasets.Features(
    {
        # int32 halves the disk and memory of int64; ids, labels and positions all fit.
        **{name: datasets.List(datasets.Value("int32")) for name in TOKEN_COLUMNS},
        "length": datasets.Value("int64"),
        **_JSON_FEATURES,
        **_ORIGIN_FEATURES,
    }
)


def dumps(value: Any) -> str:
    return json.dumps(to_jsonable(value), ensure_ascii=False)


def loads(text: str | None) -> Any:
    return None if text is None else from_jsonable(json.loads(text))


def public(row: Mapping[str, Any]) -> dict[str, Any]:
    """A raw row without the hidden origin columns."""
    return {key: value for key, value in row.items() if key not in HIDDEN}


def as_trajectory(value: Any) -> Trajectory:
    """Validate what a preprocessor returned: a Trajectory, or a dict shaped like one."""
    if isinstance(value, Trajectory):
        trajectory = value
    elif isinstance(value, Mapping):
        trajectory = Trajectory.model_validate(dict(value))
    else:
        raise TypeError(
            f"a preprocessor must return a Trajectory or a dict with 'messages', "
            f"got {type(value).__name__}"
        )
    if not trajectory.messages:
        raise ValueError("the conversation has no messages")
    return trajectory


def trajectory_to_row(trajectory: Trajectory) -> dict[str, str | None]:
    """The stored form: JSON strings (``tools`` is None when the row has none)."""
    return {
        "messages": dumps(trajectory.messages),
        "tools": None if trajectory.tools is None else dumps(trajectory.tools),
        "user_data": dumps(trajectory.user_data),
    }


def trajectory_dict(trajectory: Trajectory) -> dict[str, Any]:
    """A Trajectory as the plain dict a preprocessor receives (messages as dicts, arrays in
    ``user_data`` as numpy arrays)."""
    return from_jsonable(trajectory.to_dict())


def row_to_trajectory(row: Mapping[str, Any]) -> Trajectory:
    data = {name: loads(row[name]) for name in JSON_COLUMNS if row.get(name) is not None}
    return Trajectory.model_validate(data)


def _same_items(a: Any, b: Any) -> bool:
    return a is b or (
        isinstance(a, list)
        and isinstance(b, list)
        and len(a) == len(b)
        and all(x is y for x, y in zip(a, b, strict=True))
    )


def feature_to_row(
    feature: InputFeature, trajectory: Trajectory, source_row: Mapping[str, Any]
) -> dict[str, Any]:
    """The stored form of an encoded row; ``messages``/``tools``/``user_data`` come from the
    feature when the template set them, else from the trajectory it was encoded from.

    When the feature carries the trajectory's own objects, the JSON already stored in
    ``source_row`` is reused instead of serialising them again (a quarter of encode time
    on multi-turn data)."""
    extra = set(feature.keys()) - set(ENCODED_FEATURES)
    if extra:
        raise ValueError(
            f"the template returned fields {sorted(extra)} that an encoded dataset does not "
            f"store; it stores {', '.join(name for name in ENCODED_FEATURES if name not in HIDDEN)}"
        )
    row: dict[str, Any] = {name: None for name in TOKEN_COLUMNS}
    for name in TOKEN_COLUMNS:
        value = feature.get(name)
        if value is not None:
            row[name] = value.tolist()
    row["length"] = int(feature.length)
    for name in JSON_COLUMNS:
        value = feature.get(name)
        reuse = value is None or _same_items(value, getattr(trajectory, name, None))
        row[name] = source_row.get(name) if reuse else dumps(value)
    return row


def row_to_feature(row: Mapping[str, Any]) -> InputFeature:
    data = {
        key: loads(value) if key in JSON_COLUMNS else value
        for key, value in row.items()
        if value is not None and key not in HIDDEN
    }
    return InputFeature.model_validate(data)
