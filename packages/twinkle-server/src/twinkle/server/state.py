"""ServerState: everything a route needs, built once per server process.

Routes of every protocol (Twinkle's now, Tinker's later) take the same state: the store,
the futures, the sessions and the component services, so a second protocol mounts beside
the first as one more router.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinkle.server.auth import Principal, authenticate
from twinkle.server.config import ServerConfig
from twinkle.server.futures import FutureManager
from twinkle.server.limits import RateLimiter
from twinkle.server.plugins import load_allowed_plugins, load_plugins_on_groups
from twinkle.server.sessions import SessionManager
from twinkle.server.store import SQLiteStore, Store
from twinkle.utils import get_logger

logger = get_logger()
FUTURES_KEPT_S = 24 * 3600.0


@dataclass
class ServerState:
    config: ServerConfig
    store: Store
    home: Path
    futures: FutureManager
    sessions: SessionManager
    rate_limiter: RateLimiter
    model: Any = None  # ModelService, once loaded
    sampler: Any = None  # SamplerService, when enabled
    processor: Any = None  # ProcessorService, when enabled
    tinker: Any = None  # tinker.state.TinkerState: the Tinker routes' ordering and samplers
    ready: bool = False
    started_at: float = field(default_factory=time.time)

    def principal(self, api_key: str | None) -> Principal:
        principal = authenticate(self.store, api_key)
        self.rate_limiter.check(principal.key_id)
        return principal

    def reap_sessions(self) -> None:
        """Close sessions that stopped beating, and free their runs' LoRA slots; forget
        request records older than a day."""
        self.store.prune_futures(time.time() - FUTURES_KEPT_S)
        for session in self.sessions.expired():
            silent = time.time() - session.last_heartbeat
            logger.info(f"session {session.id} silent for {silent:.0f} s: releasing its LoRA slots")
            self.sessions.close(session.id)
            self.release_session_runs(session.id)

    def release_session_runs(self, session_id: str) -> None:
        if self.model is None:
            return
        for run_id, live in list(self.model.live.items()):
            if live.run.session_id == session_id:
                self.model.worker.cancel_lane(run_id, "the run's session ended")
                self.model.worker.submit(run_id, lambda r=run_id: self.model.release(r))

    def close(self) -> None:
        for service in (self.model, self.sampler, self.processor):
            if service is not None:
                service.stop()
        self.store.close()


def build_state(config: ServerConfig, load_components: bool = True) -> ServerState:
    home = config.storage.home_path()
    store = SQLiteStore(config.storage.database_path())
    state = ServerState(
        config=config,
        store=store,
        home=home,
        futures=FutureManager(store),
        sessions=SessionManager(
            store, config.limits.session_ttl_s, config.limits.session_heartbeat_grace_s
        ),
        rate_limiter=RateLimiter(config.limits.requests_per_minute),
    )
    from twinkle.server.tinker.state import build_tinker_state

    state.tinker = build_tinker_state()
    if load_components:
        load_services(state)
    return state


def load_services(state: ServerState) -> None:
    """Load the model (slow: minutes for a large one), then mark the server ready."""
    from twinkle.server.model_service import ModelService
    from twinkle.server.processor_service import ProcessorService
    from twinkle.server.sampler_service import SamplerService

    config = state.config
    problems = load_allowed_plugins(config.allow.plugins)  # once, shared by every tenant
    if problems:
        raise ValueError("; ".join(problems))
    if config.mode == "ray":
        start_ray(config)
        load_plugins_on_groups(config.allow.plugins, [g.name for g in config.device_groups])
    state.model = ModelService(
        config, state.store, state.home, when_a_slot_frees=state.sessions.when_a_slot_frees
    )
    if config.sampler.enabled:
        state.sampler = SamplerService(config, state.model)
    if config.processor_enabled:
        state.processor = ProcessorService(config)
    state.ready = True


def start_ray(config: ServerConfig) -> None:
    """``mode: ray``: attach to (or start) a Ray cluster and reserve the device groups; the
    model and sampler are then built on their groups' workers, behind the same routes."""
    import twinkle
    from twinkle import DeviceGroup

    groups = [
        DeviceGroup(name=g.name, ranks=g.ranks, device_type=g.device_type)
        for g in config.device_groups
    ]
    # The server answers with values, so results come back to this process (no lazy refs).
    twinkle.initialize(
        "ray", groups=groups, lazy_collect=False, ray_init_kwargs=config.ray_init_kwargs or None
    )
