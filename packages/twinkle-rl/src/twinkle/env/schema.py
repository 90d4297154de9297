"""A Python function as a tool: its JSON schema read from its signature and docstring.

``def calculator(expression: str) -> str: '''Evaluate an arithmetic expression...'''``
becomes ``Tool(name='calculator', description='Evaluate ...', parameters={'type': 'object',
'properties': {'expression': {'type': 'string', ...}}, 'required': ['expression']})``.
Parameter descriptions come from a Google-style ``Args:`` section when the docstring has one.
A parameter without a type hint, or with one that has no JSON form, is an error that names it.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from twinkle.data_format import Tool

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}
_ARG_LINE = re.compile(r"^\s{2,}(\w+)(?:\s*\([^)]*\))?:\s*(.+)$")


def tool_from_function(function: Callable[..., Any]) -> Tool:
    """The Tool that describes ``function`` (see the module docstring)."""
    name = getattr(function, "__name__", None)
    if not name or name == "<lambda>":
        raise ValueError("a tool needs a named function (def ...), not a lambda")
    hints = typing.get_type_hints(function)
    doc = inspect.getdoc(function) or ""
    described = _argument_descriptions(doc)
    properties: dict[str, Any] = {}
    required = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise ValueError(f"tool {name}: *args and **kwargs have no schema; name each argument")
        if parameter.name not in hints:
            raise ValueError(
                f"tool {name}: argument {parameter.name!r} has no type hint, so its schema is "
                "unknown; annotate it (str, int, float, bool, list[...], Literal[...])"
            )
        schema = json_schema(hints[parameter.name], f"tool {name}, argument {parameter.name!r}")
        if parameter.name in described:
            schema["description"] = described[parameter.name]
        properties[parameter.name] = schema
        if parameter.default is parameter.empty:
            required.append(parameter.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return Tool(name=name, description=_summary(doc), parameters=parameters)


def json_schema(hint: Any, where: str) -> dict[str, Any]:
    """The JSON schema of one type hint."""
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    origin = typing.get_origin(hint)
    arguments = typing.get_args(hint)
    if origin is Literal:
        return {"enum": list(arguments)}
    if origin in (list, tuple, set, frozenset) or hint in (list, tuple):
        items = arguments[0] if arguments else None
        return {"type": "array", **({"items": json_schema(items, where)} if items else {})}
    if origin is dict or hint is dict:
        return {"type": "object"}
    if origin in (Union, types.UnionType):
        kept = [a for a in arguments if a is not type(None)]
        if len(kept) == 1:
            return json_schema(kept[0], where)
        return {"anyOf": [json_schema(a, where) for a in kept]}
    raise ValueError(
        f"{where}: type {hint!r} has no JSON schema; use str, int, float, bool, list, dict "
        "or Literal"
    )


def _summary(doc: str) -> str:
    """The docstring's first paragraph, on one line."""
    return " ".join(doc.split("\n\n", 1)[0].split())


def _argument_descriptions(doc: str) -> dict[str, str]:
    """``name: text`` lines of a Google-style ``Args:`` section."""
    described: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            if line and not line.startswith(" "):
                break
            match = _ARG_LINE.match(line)
            if match:
                described[match.group(1)] = match.group(2).strip()
    return described
