"""DataModel, the base of every shared type: validated at construction and on assignment,
readable both as attributes and as a dict, and convertible to JSON for the wire.

The user's documents treat these objects as dicts (``trajectory.get('messages', [])``,
``feature['input_ids']``) and as objects (``seq.new_input_feature``), so both work. The dict
view holds the keys whose value is not None: an optional field left unset is absent, as it
would be from the dict a user writes by hand.
"""

from __future__ import annotations

import json
from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Any, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from twinkle.data_format._arrays import (
    ARRAY_KEY,
    as_numpy,
    decode_array,
    encode_array,
    is_array_like,
)


class DataModel(BaseModel):
    """Base class: strict types (no silent coercion), unknown keys rejected unless a subclass
    allows extras, every assignment validated and undone if it fails."""

    model_config = ConfigDict(strict=True, extra="forbid", validate_assignment=True)

    def _present(self) -> dict[str, Any]:
        values = {**self.__dict__, **(self.__pydantic_extra__ or {})}
        return {key: value for key, value in values.items() if value is not None}

    def keys(self) -> KeysView[str]:
        return self._present().keys()

    def values(self) -> ValuesView[Any]:
        return self._present().values()

    def items(self) -> ItemsView[str, Any]:
        return self._present().items()

    def __iter__(self) -> Iterator[str]:  # keys, as a dict iterates (pydantic yields pairs)
        return iter(self._present())

    def __contains__(self, key: object) -> bool:
        return key in self._present()

    def __getitem__(self, key: str) -> Any:
        present = self._present()
        if key in present:
            return present[key]
        name = type(self).__name__
        if key in type(self).model_fields:
            raise KeyError(f"{key!r} is not set on this {name}")
        raise KeyError(f"{name} has no key {key!r}; it has {', '.join(present)}")

    def get(self, key: str, default: Any = None) -> Any:
        return self._present().get(key, default)

    def __setitem__(self, key: str, value: Any) -> None:
        fields = type(self).model_fields
        if key not in fields and self.model_config.get("extra") != "allow":
            raise KeyError(
                f"{type(self).__name__} has no field {key!r}; its fields are {', '.join(fields)}"
            )
        setattr(self, key, value)

    def __setattr__(self, name: str, value: Any) -> None:
        # pydantic leaves a failed assignment in place; restore the state so a caught error
        # does not leave behind an object that breaks the rules it was validated against.
        extra = self.__pydantic_extra__
        saved = (
            dict(self.__dict__),
            None if extra is None else dict(extra),
            set(self.__pydantic_fields_set__),
        )
        try:
            super().__setattr__(name, value)
        except ValidationError:
            self._restore(*saved)
            raise

    def _restore(
        self, fields: dict[str, Any], extra: dict[str, Any] | None, fields_set: set[str]
    ) -> None:
        object.__setattr__(self, "__dict__", fields)
        object.__setattr__(self, "__pydantic_extra__", extra)
        object.__setattr__(self, "__pydantic_fields_set__", fields_set)

    def update(self, other: Mapping[str, Any] | None = None, /, **changes: Any) -> None:
        """Change several keys at once, validated together (fields that must agree, such as
        ``input_ids`` and ``labels``, cannot be changed one at a time)."""
        fresh = type(self).model_validate({**self._present(), **(other or {}), **changes})
        self._restore(fresh.__dict__, fresh.__pydantic_extra__, fresh.__pydantic_fields_set__)

    def __repr_args__(self) -> list[tuple[str, Any]]:
        return list(self.items())  # unset fields would only add noise

    def __eq__(self, other: object) -> bool:
        # pydantic compares field dicts, which raises on numpy arrays; compare values instead.
        if type(other) is not type(self):
            return NotImplemented
        return _equal(self._present(), other._present())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict: arrays and tensors become ``{ARRAY_KEY: {dtype, shape, data}}``,
        nested models become dicts, keys holding None are left out."""
        return {key: to_jsonable(value) for key, value in self.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Inverse of :meth:`to_dict`: encoded arrays come back as numpy arrays."""
        return cls.model_validate(from_jsonable(data))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        return cls.from_dict(json.loads(text))


def to_jsonable(value: Any) -> Any:
    """Turn a value built from models, dicts, lists, scalars, arrays and tensors into plain
    JSON types; raises TypeError for anything else rather than guessing (no pickle)."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, DataModel):
        return value.to_dict()
    if is_array_like(value):
        return encode_array(value)
    if isinstance(value, Mapping):
        if set(value) == {ARRAY_KEY}:
            raise ValueError(f"a dict with the single key {ARRAY_KEY!r} is reserved for arrays")
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be strings, got {key!r}")
            out[key] = to_jsonable(item)
        return out
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    raise TypeError(f"cannot encode a {type(value).__name__} as JSON")


def from_jsonable(value: Any) -> Any:
    """Inverse of :func:`to_jsonable` for plain data: encoded arrays become numpy arrays;
    models come back as dicts (validate them with the class you expect)."""
    if isinstance(value, dict):
        if len(value) == 1 and ARRAY_KEY in value:
            return decode_array(value[ARRAY_KEY])
        return {key: from_jsonable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [from_jsonable(item) for item in value]
    return value


def _equal(a: Any, b: Any) -> bool:
    if is_array_like(a) or is_array_like(b):
        if not (is_array_like(a) and is_array_like(b)):
            return False
        x, y = as_numpy(a), as_numpy(b)
        return x.dtype == y.dtype and x.shape == y.shape and bool(np.array_equal(x, y))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_equal(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
