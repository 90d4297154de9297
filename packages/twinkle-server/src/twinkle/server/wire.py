"""Turning request JSON into the values components take, with the server's limits.

Only JSON arrives (``twinkle.data_format`` encodes arrays as typed lists); nothing here
resolves a class or a path. Keyword arguments meant for constructors (optimizer, loss,
template) must be plain JSON scalars or lists of them.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from twinkle.data_format import InputFeature, Trajectory, from_jsonable, to_jsonable
from twinkle.hub.plugin import is_reference
from twinkle.server.errors import BadRequest
from twinkle.server.limits import check_depth, check_rows, check_tokens, depth_error
from twinkle.server.plugins import not_allowed

if TYPE_CHECKING:
    from twinkle.server.config import Limits

_SCALARS = (str, int, float, bool, type(None))


def parse_json(raw: bytes, limits: Limits, what: str = "the request body") -> Any:
    """A request body as JSON, nested at most ``limits.max_json_depth`` deep (a body of
    100,000 ``[`` would otherwise exhaust the parser's stack: a RecursionError)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise depth_error(limits) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"{what} is not valid JSON: {exc}") from None
    check_depth(value, limits)
    return value


def plain_kwargs(kwargs: Any, what: str) -> dict[str, Any]:
    """Keyword arguments of scalars (or flat lists of scalars) only."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise BadRequest(f"{what}: keyword arguments must be a JSON object")
    for key, value in kwargs.items():
        flat = isinstance(value, list) and all(isinstance(v, _SCALARS) for v in value)
        if not (isinstance(value, _SCALARS) or flat):
            raise BadRequest(
                f"{what}: argument {key!r} must be a number, string, bool or a list of them"
            )
        for item in value if flat else [value]:
            if isinstance(item, float) and not math.isfinite(item):  # for an optimizer or loss
                raise BadRequest(f"{what}: argument {key!r} must be a finite number, got {item}")
    return dict(kwargs)


TEMPLATE_KEYS = {
    "max_length",
    "truncation_strategy",
    "default_system",
    "enable_thinking",
    "train_turns",
    "history_mismatch",
}
"""Template arguments a client may set: not ``chat_template`` (server-side Jinja from a
client) and no tokenizer arguments (``trust_remote_code``, ``cache_dir``, ...)."""


def template_kwargs(kwargs: Any, name: str, model_id: str) -> dict[str, Any]:
    """A template's keyword arguments from a client, with the served model's tokenizer."""
    kwargs = plain_kwargs(kwargs, name)
    kwargs.pop("model_id", None)
    unknown = set(kwargs) - TEMPLATE_KEYS
    if unknown:
        raise BadRequest(
            f"template arguments {sorted(unknown)} cannot be set remotely; use "
            f"{sorted(TEMPLATE_KEYS)}"
        )
    return {**kwargs, "model_id": model_id}


def bounded_workers(kwargs: dict[str, Any], limit: int = 2) -> dict[str, Any]:
    """``num_proc`` of a dataset operation, capped: a client cannot fork the server away."""
    num_proc = kwargs.get("num_proc")
    if num_proc is not None and (
        isinstance(num_proc, bool) or not isinstance(num_proc, int) or not 1 <= num_proc <= limit
    ):
        raise BadRequest(f"num_proc must be between 1 and {limit} on this server")
    return kwargs


def check_allowed(name: Any, allowed: list[str], what: str) -> str:
    if not isinstance(name, str):
        raise BadRequest(f"{what} must be given by name (a string), got {type(name).__name__}")
    if name not in allowed and is_reference(name):
        raise not_allowed(name, allowed, what)
    if name not in allowed:
        raise BadRequest(f"unknown {what} {name!r}; this server allows: {', '.join(allowed)}")
    return name


def decode_inputs(inputs: Any, limits: Limits) -> list[InputFeature | Trajectory]:
    """A batch of InputFeatures or Trajectories from their JSON dicts, within the rows and
    tokens per row of ``limits``."""
    if isinstance(inputs, dict):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise BadRequest("inputs must be a non-empty list of InputFeature or Trajectory objects")
    check_rows(len(inputs), limits)
    batch: list[InputFeature | Trajectory] = []
    for index, row in enumerate(inputs):
        if not isinstance(row, dict):
            raise BadRequest(f"inputs[{index}] must be an object, got {type(row).__name__}")
        try:
            data = from_jsonable(row)
            item = InputFeature.model_validate(data) if "input_ids" in data else None
            if item is None:
                item = Trajectory.model_validate(data)
        except (ValueError, TypeError) as exc:
            raise BadRequest(
                f"inputs[{index}] is not a valid InputFeature or Trajectory: {exc}"
            ) from None
        if isinstance(item, InputFeature):
            check_tokens(int(item.length or 0), limits, f"inputs[{index}]")
        batch.append(item)
    return batch


def decode_value(value: Any) -> Any:
    """Loss arguments (advantages, old_logps, ...): encoded arrays become numpy arrays."""
    try:
        return from_jsonable(value)
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"invalid array argument: {exc}") from None


def encode(value: Any) -> Any:
    return to_jsonable(value)
