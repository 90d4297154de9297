"""The Megatron-core backend: MegatronModel (needs the extra ``twinkle-models[megatron]``).

Importing this package does not import megatron-core; building a MegatronModel does,
and says which extra to install when it is missing.
"""

from twinkle.model.megatron.model import MegatronModel

__all__ = ["MegatronModel"]
