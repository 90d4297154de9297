"""The remote API: which methods of which components a client may call, with their parameters.

The table is data, ``remote_api.json`` beside this module, written by the server package
(``python tools/write_client_table.py``) from the ``@remote_function(wire=...)``
declarations on the local components; a server test regenerates it and compares the bytes,
so it cannot drift. Shipping it as data keeps this package torch-free. ``REMOTE_API`` is
the same table by parameter names, as ``GET /api/v1/twinkle/api`` publishes it (``**``
stands for the component's catch-all keyword arguments). ``CLIENT_EXTRAS`` lists the
parameters a proxy adds because the call crosses the network.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

SPECIFICATION: dict[str, dict[str, dict[str, Any]]] = json.loads(
    resources.files("twinkle_client").joinpath("remote_api.json").read_text(encoding="utf-8")
)

REMOTE_API: dict[str, dict[str, list[str]]] = {
    component: {
        name: ["**" if p["kind"] == "var_keyword" else p["name"] for p in entry["params"]]
        for name, entry in methods.items()
    }
    for component, methods in SPECIFICATION.items()
}

CLIENT_EXTRAS: dict[str, list[str]] = {
    "sampler.sample": ["adapter_uri"],
}
