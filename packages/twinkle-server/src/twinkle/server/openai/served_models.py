"""What a caller may name as ``model``: the base model, its own checkpoints, and its runs'
latest sampler weights. Another key's checkpoint or run is a 404, exactly like a missing one.
"""

from __future__ import annotations

from dataclasses import dataclass

from twinkle.server.auth import Principal
from twinkle.server.checkpoint_access import live
from twinkle.server.errors import NotFound
from twinkle.server.names import RUN_ID, SCHEME
from twinkle.server.state import ServerState
from twinkle.server.store import CheckpointRecord

SCHEMES = (SCHEME, "tinker://")


@dataclass(frozen=True)
class ServedModel:
    id: str
    created: int
    owned_by: str
    folder: str | None  # the adapter's checkpoint folder; None for the base model


def resolve(state: ServerState, principal: Principal, name: object) -> ServedModel:
    """The model a request names, or a 404 that says what may be named."""
    base = state.config.model.model_id
    if name == base:
        return ServedModel(base, int(state.started_at), "twinkle", None)
    if not isinstance(name, str) or not name.startswith(SCHEMES):
        raise NotFound(
            f"model {name!r} is not served here: name the base model {base!r}, a checkpoint "
            "twinkle://<run>/sampler_weights/<name>, or twinkle://<run> (GET /v1/models "
            "lists yours)"
        )
    scheme = next(s for s in SCHEMES if name.startswith(s))
    if "/" not in name[len(scheme) :]:
        return _latest_of_run(state, principal, name, name[len(scheme) :])
    record = state.model.owned_checkpoint(principal, name)
    return _served(record, principal, name)


def listed(state: ServerState, principal: Principal) -> list[ServedModel]:
    """The base model, then each of the caller's checkpoints, then ``twinkle://<run>`` for
    each of its runs that saved sampler weights (oldest first)."""
    base = state.config.model.model_id
    models = [ServedModel(base, int(state.started_at), "twinkle", None)]
    records = _live_checkpoints(state, principal)
    models += [_served(r, principal, _uri(r)) for r in records]
    latest: dict[str, CheckpointRecord] = {}
    for record in records:
        if record.kind == "sampler_weights":
            latest[record.run_id] = record
    models += [_served(r, principal, f"{SCHEME}{run}") for run, r in latest.items()]
    return models


def _latest_of_run(state: ServerState, principal: Principal, name: str, run_id: str):
    if not RUN_ID.match(run_id) or state.store.get_run(principal.key_id, run_id) is None:
        raise NotFound(f"no training run {run_id!r}")
    sampler = [
        r for r in _live_checkpoints(state, principal, run_id) if r.kind == "sampler_weights"
    ]
    if not sampler:
        raise NotFound(
            f"training run {run_id!r} has saved no sampler weights yet: call "
            "save_weights_for_sampler, or name one of its checkpoints"
        )
    return _served(sampler[-1], principal, name)


def _live_checkpoints(
    state: ServerState, principal: Principal, run_id: str | None = None
) -> list[CheckpointRecord]:
    """The caller's checkpoints that have not expired (the reaper deletes the rest later)."""
    return [r for r in state.store.list_checkpoints(principal.key_id, run_id) if live(r)]


def _uri(record: CheckpointRecord) -> str:
    return f"{SCHEME}{record.run_id}/{record.kind}/{record.name}"


def _served(record: CheckpointRecord, principal: Principal, name: str) -> ServedModel:
    return ServedModel(name, int(record.created_at), principal.name, record.path)
