"""Point the unmodified Tinker SDK at a Twinkle server through its own environment variables.

The SDK reads ``TINKER_BASE_URL`` and ``TINKER_API_KEY`` (both 0.16 and 0.38); a Twinkle
user already has ``TWINKLE_SERVER_URL`` and ``TWINKLE_SERVER_TOKEN`` set for the Twinkle
client: copying one pair into the other points the SDK at the server. The SDK also learns
to take the ``twinkle://`` form of a checkpoint path (``twinkle.utils.tinker_paths``); a
process that never calls ``init_tinker_client`` gets the SDK untouched.
This lives in twinkle-mesh so that ``from twinkle import init_tinker_client`` works without
twinkle-client; ``twinkle_client`` re-exports it.
"""

from __future__ import annotations

import os

from twinkle.utils.tinker_paths import accept_twinkle_paths

TWINKLE_URL_ENV = "TWINKLE_SERVER_URL"
TWINKLE_TOKEN_ENV = "TWINKLE_SERVER_TOKEN"
TINKER_URL_ENV = "TINKER_BASE_URL"
TINKER_KEY_ENV = "TINKER_API_KEY"
# Twinkle's default server (the same default as twinkle_client's), so that an unset URL
# never sends a Twinkle user's requests to the hosted Tinker service.
DEFAULT_URL = "http://127.0.0.1:8000"


def init_tinker_client(base_url: str | None = None, api_key: str | None = None) -> None:
    """Set ``TINKER_BASE_URL`` / ``TINKER_API_KEY`` for ``tinker.ServiceClient()``.

    Arguments win; otherwise values the user already gave the SDK are kept; otherwise the
    Twinkle variables are copied (the URL falls back to Twinkle's local default). Call it
    before creating a ServiceClient; arguments passed to ServiceClient still override it.
    From then on every SDK call that takes a checkpoint path also takes its ``twinkle://``
    form (the SDK is wrapped now if imported, else when it is).
    """
    accept_twinkle_paths()
    url = base_url or os.environ.get(TINKER_URL_ENV) or os.environ.get(TWINKLE_URL_ENV)
    os.environ[TINKER_URL_ENV] = (url or DEFAULT_URL).rstrip("/")
    key = api_key or os.environ.get(TINKER_KEY_ENV) or os.environ.get(TWINKLE_TOKEN_ENV)
    if key:
        os.environ[TINKER_KEY_ENV] = key
