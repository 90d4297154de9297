"""The remote API, derived from the local components themselves.

A model method is offered over HTTP by one declaration: ``wire=WirePolicy(...)`` in its
``@remote_function`` (``twinkle.infra.remote``). From it come the server's dispatch table
(``ModelService.methods``), ``GET /api/v1/twinkle/api`` and twinkle-client's proxies. The
other components' methods (Dataset, DataLoader, the Sampler protocol) are listed here.

The client must stay torch-free, so it cannot import the model classes to read their
specs. It ships the table as data instead: ``twinkle_client/remote_api.json``, written by
``python tools/write_client_table.py`` (``render`` here) and committed; a twinkle-kit test
regenerates it and fails unless the bytes are the same (the server never imports the
client). Data rather than generated code keeps the client's proxies plain functions built
at import (help() and tab completion read the signatures and docstrings carried in the
table), and a stale table shows as a one-file diff.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from twinkle.infra.remote import WirePolicy, find_remote_spec

SAMPLER_METHODS = ("sample", "set_template")
DATASET_METHODS = ("set_template", "map", "encode")
DATALOADER_METHODS = ("get_state", "resume_from_checkpoint")
SERVER_ONLY = {"self", "adapter_name", "output_dir", "device_mesh", "remote_group"}
KINDS = {
    inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
    inspect.Parameter.KEYWORD_ONLY: "keyword",
    inspect.Parameter.VAR_KEYWORD: "var_keyword",
}


def wire_methods(cls: type) -> dict[str, WirePolicy]:
    """The methods of ``cls`` offered over HTTP (a ``wire`` in their spec), by name."""
    methods = {}
    for name in sorted(dir(cls)):
        spec = find_remote_spec(cls, name) if callable(getattr(cls, name, None)) else None
        if spec is not None and spec.wire is not None:
            methods[name] = spec.wire
    return methods


def parameter_specs(func: Any, keep: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The parameters a client passes, as JSON: name, kind and default (when it has one)."""
    params = []
    for param in inspect.signature(func).parameters.values():
        if param.name in SERVER_ONLY - set(keep):
            continue
        if param.kind not in KINDS:
            raise TypeError(f"{func.__qualname__}: *{param.name} cannot be offered over HTTP")
        entry: dict[str, Any] = {"name": param.name, "kind": KINDS[param.kind]}
        if param.default is not param.empty:
            json.dumps(param.default)  # a default the client cannot carry fails here
            entry["default"] = param.default
        params.append(entry)
    return params


def method_spec(func: Any, wire: WirePolicy | None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "params": parameter_specs(func, wire.server_names if wire else ()),
        "doc": inspect.getdoc(func) or "",
    }
    if wire is not None:
        entry["wire"] = {
            "named": list(wire.named),
            "batch": wire.batch,
            "positive": list(wire.positive),
            "returns": wire.returns,
            "client_drops": list(wire.client_drops),
            "own_route": wire.own_route,
        }
    return entry


def specification() -> dict[str, dict[str, dict[str, Any]]]:
    """The full table the client ships: every method's parameters, docstring and policy."""
    from twinkle.dataloader import DataLoader
    from twinkle.dataset import Dataset
    from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel
    from twinkle.sampler.base import Sampler

    model = MultiLoraTransformersModel
    table = {
        "model": {
            name: method_spec(getattr(model, name), wire)
            for name, wire in wire_methods(model).items()
        }
    }
    for component, cls, methods in (
        ("sampler", Sampler, SAMPLER_METHODS),
        ("dataset", Dataset, DATASET_METHODS),
        ("dataloader", DataLoader, DATALOADER_METHODS),
    ):
        table[component] = {name: method_spec(getattr(cls, name), None) for name in methods}
    return table


def parameter_names(entry: dict[str, Any]) -> list[str]:
    """A method's parameter names (``**`` for a catch-all of keyword arguments)."""
    return ["**" if p["kind"] == "var_keyword" else p["name"] for p in entry["params"]]


def describe() -> dict[str, dict[str, list[str]]]:
    """The table as ``GET /api`` publishes it: each method's parameter names."""
    return {
        component: {name: parameter_names(entry) for name, entry in methods.items()}
        for component, methods in specification().items()
    }


def render() -> str:
    """The bytes of ``remote_api.json``: stable order, one trailing newline."""
    return json.dumps(specification(), indent=1, ensure_ascii=False) + "\n"
