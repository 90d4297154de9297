"""The multi-tenant training service and the ``twinkle-server`` command.

``twinkle-server launch -c config.yaml`` serves one base model to many API keys, each
training its own LoRA adapters (see the package README). In code: ``load_config``,
``build_state`` and ``create_app`` build the same FastAPI application, and ``launch`` serves
it (on Ray Serve after ``twinkle.initialize('http', groups=...)``).
"""

from twinkle.server.config import ServerConfig, load_config
from twinkle.server.serve import launch

__all__ = ["ServerConfig", "launch", "load_config"]
