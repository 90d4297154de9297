"""Write twinkle-client's remote API table from the components' ``@remote_function`` specs.

Usage: python tools/write_client_table.py   (from the workspace venv; run it after changing a
remote model method's signature, docstring or wire policy, and commit the file)
"""

from __future__ import annotations

from pathlib import Path

from twinkle.server.remote_api import render

CLIENT_TABLE = (
    Path(__file__).resolve().parents[1]
    / "packages"
    / "twinkle-client"
    / "src"
    / "twinkle_client"
    / "remote_api.json"
)

if __name__ == "__main__":
    CLIENT_TABLE.write_text(render(), encoding="utf-8")
    print(f"wrote {CLIENT_TABLE}")
