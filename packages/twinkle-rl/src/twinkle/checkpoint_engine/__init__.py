"""Weight sync from the trained model to the sampler."""

from twinkle.checkpoint_engine.base import CheckpointEngine, TransferStats, apply_payload
from twinkle.checkpoint_engine.broadcast import BroadcastEngine
from twinkle.checkpoint_engine.in_process import InProcessEngine
from twinkle.checkpoint_engine.manager import CheckpointEngineManager
from twinkle.checkpoint_engine.payload import Payload
from twinkle.checkpoint_engine.peer_group import PeerGroup

__all__ = [
    "BroadcastEngine",
    "CheckpointEngine",
    "CheckpointEngineManager",
    "InProcessEngine",
    "Payload",
    "PeerGroup",
    "TransferStats",
    "apply_payload",
]
