"""The torch-free client's remote API table is what the server's specs generate, byte for
byte: a remote method changed without regenerating the table fails here."""

from pathlib import Path

import twinkle_client
from twinkle.server.remote_api import render


def test_the_shipped_client_table_is_what_the_specs_generate():
    shipped = (Path(twinkle_client.__file__).parent / "remote_api.json").read_text("utf-8")
    assert render() == shipped, (
        "twinkle_client/remote_api.json is stale: run python tools/write_client_table.py"
    )
