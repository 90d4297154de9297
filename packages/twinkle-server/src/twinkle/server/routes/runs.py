"""Training runs and checkpoints: listing, reading and deleting, each by its owner only.

Another key's run or checkpoint answers 404, exactly like one that does not exist, so ids
cannot be probed.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from twinkle.server.checkpoint_access import iso, live, readable
from twinkle.server.errors import BadRequest, NotFound
from twinkle.server.names import CheckpointUri, parse_uri
from twinkle.server.routes import checkpoints_io
from twinkle.server.routes.common import caller, json_body, ready, state_of
from twinkle.server.store import CheckpointRecord, TrainingRun

router = APIRouter()
# First: the ``{checkpoint_id:path}`` routes below would take its /archive, /ttl, /publish.
router.include_router(checkpoints_io.router)
TYPES = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}


def checkpoint_json(record: CheckpointRecord) -> dict[str, Any]:
    uri = CheckpointUri(record.run_id, record.kind, record.name)
    return {
        "checkpoint_id": uri.checkpoint_id,
        "checkpoint_type": TYPES[record.kind],
        "time": iso(record.created_at),
        "twinkle_path": str(uri),
        "tinker_path": str(uri).replace("twinkle://", "tinker://", 1),
        "size_bytes": record.size_bytes,
        "has_optimizer": record.has_optimizer,
        "public": record.public,
        "expires_at": iso(record.expires_at),
    }


def run_json(state, run: TrainingRun) -> dict[str, Any]:
    checkpoints = _live(state.store.list_checkpoints(run.owner, run.id))
    weights = [c for c in checkpoints if c.kind == "weights"]
    sampler = [c for c in checkpoints if c.kind == "sampler_weights"]
    return {
        "training_run_id": run.id,
        "base_model": run.base_model,
        "model_owner": run.owner,
        "is_lora": True,
        "lora_rank": run.lora_rank,
        "adapter_name": run.adapter_name,
        "lora_config": run.lora_config,
        "active": run.active and state.model is not None and run.id in state.model.live,
        "corrupted": False,
        "last_request_time": iso(run.last_request_time),
        "last_checkpoint": checkpoint_json(weights[-1]) if weights else None,
        "last_sampler_checkpoint": checkpoint_json(sampler[-1]) if sampler else None,
        "user_metadata": run.user_metadata,
    }


def page(request: Request) -> tuple[int, int]:
    try:
        limit = int(request.query_params.get("limit", 20))
        offset = int(request.query_params.get("offset", 0))
    except ValueError:
        raise BadRequest("limit and offset must be integers") from None
    if not 1 <= limit <= 1000 or offset < 0:
        raise BadRequest("limit must be in 1..1000 and offset >= 0")
    return limit, offset


@router.get("/training_runs")
async def list_runs(request: Request) -> dict:
    principal = caller(request)
    state = state_of(request)
    limit, offset = page(request)
    runs, total = state.store.list_runs(principal.key_id, limit, offset)
    return {
        "training_runs": [run_json(state, run) for run in runs],
        "cursor": {"offset": offset, "limit": limit, "total_count": total},
    }


@router.get("/training_runs/{run_id}")
async def get_run(run_id: str, request: Request) -> dict:
    principal = caller(request)
    state = state_of(request)
    run = state.store.get_run(principal.key_id, run_id)
    if run is None:
        raise NotFound(f"no training run {run_id!r}")
    return run_json(state, run)


@router.get("/training_runs/{run_id}/checkpoints")
async def list_run_checkpoints(run_id: str, request: Request) -> dict:
    principal = caller(request)
    state = state_of(request)
    if state.store.get_run(principal.key_id, run_id) is None:
        raise NotFound(f"no training run {run_id!r}")
    records = _live(state.store.list_checkpoints(principal.key_id, run_id))
    return {"checkpoints": [checkpoint_json(r) for r in records]}


@router.get("/checkpoints")
async def list_all_checkpoints(request: Request) -> dict:
    principal = caller(request)
    records = _live(state_of(request).store.list_checkpoints(principal.key_id))
    return {"checkpoints": [checkpoint_json(r) for r in records]}


def _live(records: list[CheckpointRecord]) -> list[CheckpointRecord]:
    """Expired checkpoints read as gone at once (the reaper deletes them soon after)."""
    return [r for r in records if live(r) is not None]


@router.get("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}")
async def get_checkpoint(run_id: str, checkpoint_id: str, request: Request) -> dict:
    """One checkpoint, with ``path``: its folder on the server's filesystem (the owner's
    own files, for a client that shares that filesystem or a job that reads them there)."""
    principal = caller(request)
    state = state_of(request)
    uri = parse_uri(f"twinkle://{run_id}/{checkpoint_id}")
    record = live(state.store.get_checkpoint(principal.key_id, uri.run_id, uri.kind, uri.name))
    if record is None:
        raise NotFound(f"no checkpoint {uri}")
    return {**checkpoint_json(record), "path": record.path}


@router.delete("/training_runs/{run_id}/checkpoints/{checkpoint_id:path}")
async def delete_checkpoint(run_id: str, checkpoint_id: str, request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    state.model.delete_checkpoint(principal, run_id, checkpoint_id)
    return {}


@router.post("/weights_info")
async def weights_info(request: Request) -> dict:
    principal = caller(request)
    state = state_of(request)
    body = await json_body(request)
    path = body.get("twinkle_path") or body.get("tinker_path")
    if path is None:
        raise BadRequest("the request needs 'twinkle_path' (twinkle://<run>/weights/<name>)")
    record = readable(state.store, principal, path)  # the caller's, or published
    run = state.store.get_run(record.owner, record.run_id)
    if run is None:
        raise NotFound(f"no checkpoint {path}")
    targets = run.lora_config.get("target_modules")
    targets = set([targets] if isinstance(targets, str) else targets or [])
    everything = "all-linear" in targets
    return {
        "base_model": run.base_model,
        "is_lora": True,
        "lora_rank": run.lora_rank,
        "lora_config": run.lora_config,
        # Tinker's view of the same LoRA (WeightsInfoResponse)
        "train_attn": everything or bool(targets & {"q_proj", "k_proj", "v_proj", "o_proj"}),
        "train_mlp": everything or bool(targets & {"gate_proj", "up_proj", "down_proj"}),
        "train_unembed": "lm_head" in targets,
    }
