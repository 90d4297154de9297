"""twinkle_client: talk to a Twinkle server from a laptop, without torch.

It installs and imports without torch: it needs only twinkle-mesh (for the shared
data types) and an HTTP client. ``init_twinkle_client(base_url, api_key)`` connects; the
proxies in ``twinkle_client.model``, ``.sampler``, ``.dataset`` and ``.dataloader`` then
mirror the local components' methods, running them on the server.
``init_tinker_client()`` points the unmodified Tinker SDK at the same server instead.
"""

from twinkle.utils.tinker_env import init_tinker_client
from twinkle_client.errors import TwinkleClientError
from twinkle_client.manager import TwinkleClient, get_client, init_twinkle_client

__version__ = "0.1.0"

__all__ = [
    "TwinkleClient",
    "TwinkleClientError",
    "get_client",
    "init_tinker_client",
    "init_twinkle_client",
]
