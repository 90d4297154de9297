"""twinkle_client: talk to a Twinkle server from a laptop, without torch.

It installs and imports without torch: it needs only twinkle-mesh (for the shared
data types) and an HTTP client.
"""

__version__ = "0.1.0"
