"""Proxy methods made from the remote API table, one per method the server offers.

Each made method has the signature and docstring the table carries (those of the local
component's method, plus the keyword-only ``adapter_name`` a proxy picks its run with),
so ``help()`` and tab completion show what the local model shows. A call binds its
arguments to that signature (a wrong keyword fails here, before any request), encodes
them as the method's wire policy says and posts them to ``/model/<method>``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from twinkle.data_format import ModelOutput
from twinkle_client._wire import batch_rows, name_of

KINDS = {
    "positional": inspect.Parameter.POSITIONAL_OR_KEYWORD,
    "keyword": inspect.Parameter.KEYWORD_ONLY,
    "var_keyword": inspect.Parameter.VAR_KEYWORD,
}
ADAPTER = inspect.Parameter("adapter_name", inspect.Parameter.KEYWORD_ONLY, default=None)


def signature(entry: dict[str, Any]) -> inspect.Signature:
    """``self``, the table's parameters, and ``adapter_name`` first among the keywords."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for p in entry["params"]:
        kind = KINDS[p["kind"]]
        if kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD and ADAPTER not in params:
            params.append(ADAPTER)
        default = p.get("default", inspect.Parameter.empty)
        params.append(inspect.Parameter(p["name"], kind, default=default))
    if ADAPTER not in params:
        params.append(ADAPTER)
    return inspect.Signature(params)


def model_method(name: str, entry: dict[str, Any]) -> Callable[..., Any]:
    """The proxy of one model method: ``self._call(name, adapter_name, **encoded)``."""
    sig = signature(entry)
    wire = entry["wire"]
    catch_all = next((p["name"] for p in entry["params"] if p["kind"] == "var_keyword"), None)

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        del values["self"]
        adapter_name = values.pop("adapter_name")
        extra = values.pop(catch_all, {}) if catch_all else {}
        for dropped in wire["client_drops"]:
            extra.pop(dropped, None)
        for named in wire["named"]:
            values[named] = name_of(values[named], named.removesuffix("_cls"))
        if wire["batch"] is not None:
            values[wire["batch"]] = batch_rows(values[wire["batch"]])
        result = self._call(name, adapter_name, **values, **extra)
        return ModelOutput.from_dict(result) if wire["returns"] == "model_output" else result

    method.__name__ = method.__qualname__ = name
    method.__doc__ = entry["doc"]
    method.__signature__ = sig  # type: ignore[attr-defined]
    return method


def add_model_methods(cls: type, methods: dict[str, dict[str, Any]]) -> None:
    """Give ``cls`` a proxy for every table method without a route of its own."""
    for name, entry in methods.items():
        if entry["wire"]["own_route"]:
            continue
        method = model_method(name, entry)
        method.__qualname__ = f"{cls.__name__}.{name}"
        setattr(cls, name, method)
