"""Checkpoints in and out: publish/unpublish, TTLs, archive downloads, exported files'
URLs, signed download links, and importing a peft adapter (Twinkle and Tinker clients alike).

Reading (an archive, weights info, loading, sampling) is open to the owner and, for a
published checkpoint, to any key naming it by path; everything else is the owner's alone.
Another key's unpublished checkpoint answers 404, like one that does not exist. These
routes are mounted before ``runs``', whose ``{checkpoint_id:path}`` would swallow them.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from email.utils import formatdate
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, StreamingResponse

from twinkle.server import archive, checkpoint_access, download_links, hub_push
from twinkle.server.errors import BadRequest, Conflict, NotFound
from twinkle.server.names import CheckpointUri, check_name, parse_uri
from twinkle.server.routes.common import caller, json_body, ready, state_of
from twinkle.server.state import ServerState
from twinkle.server.tinker.base_model import served_repo_id

router = APIRouter()
CHECKPOINT = "/training_runs/{run_id}/checkpoints/{checkpoint_id:path}"
WAIT_FOR_SAVE_S = 30.0
EXPORT = "export"
"""The sub-folder of an external-weights checkpoint holding the files its URLs serve."""


def _uri(run_id: str, checkpoint_id: str) -> CheckpointUri:
    return parse_uri(f"twinkle://{run_id}/{checkpoint_id}")


def public_model_name(base_model: str) -> str:
    """The base model as an archive names it: a hub repo id, else the served id."""
    return served_repo_id(base_model) or base_model


@router.post(f"{CHECKPOINT}/publish")
async def publish(run_id: str, checkpoint_id: str, request: Request) -> dict:
    return _set_public(request, _uri(run_id, checkpoint_id), True)


@router.delete(f"{CHECKPOINT}/publish")
async def unpublish(run_id: str, checkpoint_id: str, request: Request) -> dict:
    return _set_public(request, _uri(run_id, checkpoint_id), False)


def _set_public(request: Request, uri: CheckpointUri, public: bool) -> dict:
    principal = caller(request)
    store = state_of(request).store
    checkpoint_access.owned(store, principal, uri)
    store.set_checkpoint_public(principal.key_id, uri.run_id, uri.kind, uri.name, public)
    return {}


@router.put(f"{CHECKPOINT}/ttl")
async def set_ttl(run_id: str, checkpoint_id: str, request: Request) -> dict:
    """``{"ttl_seconds": n}`` from now, or ``null`` to keep it for good."""
    principal = caller(request)
    state = state_of(request)
    uri = _uri(run_id, checkpoint_id)
    body = await json_body(request)
    if "ttl_seconds" not in body:
        raise BadRequest("the request needs 'ttl_seconds' (seconds from now, or null: never)")
    expires_at = checkpoint_access.expiry(
        body["ttl_seconds"], state.config.limits.max_checkpoint_ttl_s
    )
    checkpoint_access.owned(state.store, principal, uri)
    state.store.set_checkpoint_expiry(principal.key_id, uri.run_id, uri.kind, uri.name, expires_at)
    return {"expires_at": checkpoint_access.iso(expires_at)}


@router.get(f"{CHECKPOINT}/archive")
async def archive_url(run_id: str, checkpoint_id: str, request: Request) -> RedirectResponse:
    """A 302 to a signed link to the checkpoint's peft archive (the Tinker SDK reads the
    link from ``Location`` and ``Expires``; a client that follows it gets the archive)."""
    principal = caller(request)
    state = ready(state_of(request))
    uri = _uri(run_id, checkpoint_id)
    record = await _readable_when_written(state, principal, uri)
    url, expires_at = _link(request, state, principal, record, download_links.ARCHIVE)
    headers = {"Expires": formatdate(expires_at, usegmt=True)}
    return RedirectResponse(url, status_code=302, headers=headers)


@router.get(f"{CHECKPOINT}/external_weights_urls")
async def external_weights_urls(run_id: str, checkpoint_id: str, request: Request) -> dict:
    """One signed link per exported file of an ``external_weights`` checkpoint."""
    principal = caller(request)
    state = ready(state_of(request))
    uri = _uri(run_id, checkpoint_id)
    if uri.kind != "external_weights":
        raise BadRequest(
            f"{uri} is not external weights: save them with save_weights_external, or GET "
            f"{uri.checkpoint_id}/archive for this checkpoint's peft archive"
        )
    record = checkpoint_access.readable(state.store, principal, str(uri))
    files = sorted(os.listdir(_export_folder(record.path)))
    urls, expires_at = {}, 0.0
    for name in files:
        urls[name], expires_at = _link(request, state, principal, record, name)
    return {"urls": urls, "expires": checkpoint_access.iso(expires_at)}


@router.get("/downloads/{token}")
async def download(token: str, request: Request) -> StreamingResponse:
    """What a signed link grants, with no API key: the archive or one exported file."""
    state = ready(state_of(request))
    grant = download_links.verify(download_links.server_secret(state.home), token)
    record = checkpoint_access.live(
        state.store.get_checkpoint(grant.owner, grant.run_id, grant.kind, grant.name)
    )
    if record is None or (grant.reader != record.owner and not record.public):
        raise NotFound("the checkpoint this link was made for is gone")
    if grant.file == download_links.ARCHIVE:
        run = state.store.get_run(grant.owner, grant.run_id)
        base = public_model_name(run.base_model if run else state.model.base_model)
        handle = await asyncio.to_thread(archive.build_archive, record.path, base)
        size = os.fstat(handle.fileno()).st_size
        name = f"{grant.run_id.replace(':', '_')}-{grant.kind}-{grant.name}.tar.gz"
        media, headers = (
            "application/gzip",
            {"Content-Disposition": f'attachment; filename="{name}"'},
        )
    else:
        folder = _export_folder(record.path)
        if grant.file not in os.listdir(folder):
            raise NotFound("the file this link was made for is gone")
        handle = open(folder / grant.file, "rb")  # noqa: SIM115 (closed by archive.stream)
        size, media, headers = os.fstat(handle.fileno()).st_size, "application/octet-stream", {}
    headers["Content-Length"] = str(size)
    return StreamingResponse(archive.stream(handle), media_type=media, headers=headers)


@router.post(f"{CHECKPOINT}/push")
async def push_to_hub(run_id: str, checkpoint_id: str, request: Request) -> dict:
    """``{"repo_id": "org/name", "token": ..., "private": true}``: push the checkpoint's
    peft folder to that hub repo (``hub_push``); the caller's own or a published one."""
    principal = caller(request)
    state = ready(state_of(request))
    record = checkpoint_access.readable(state.store, principal, str(_uri(run_id, checkpoint_id)))
    body = await json_body(request)
    repo_id = hub_push.check_repo_id(body.get("repo_id"))
    token = body.get("token")
    if token is not None and not isinstance(token, str):
        raise BadRequest("token must be a string (a hub access token) or null")
    run = state.store.get_run(record.owner, record.run_id)
    base = public_model_name(run.base_model if run else state.model.base_model)

    def export_and_push() -> dict:
        with tempfile.TemporaryDirectory() as folder:
            archive.export_files(record.path, base, Path(folder))
            return hub_push.push(Path(folder), repo_id, token, bool(body.get("private", True)))

    return await asyncio.to_thread(export_and_push)


@router.post("/checkpoints/import")
async def import_adapter(request: Request) -> dict:
    """Import a peft LoRA adapter (the body: a gzipped tar of its folder) as the checkpoint
    ``weights/<name>`` of a new training run of the caller's, ready to load and train on."""
    from twinkle.server import adapter_import  # torch and peft: loaded on first use

    principal = caller(request)
    state = ready(state_of(request))
    name = check_name(request.query_params.get("name"), "adapter name")
    raw = await request.body()
    files = adapter_import.read_archive(raw)
    run, record = await asyncio.to_thread(
        adapter_import.import_adapter, state, principal, name, files
    )
    uri = CheckpointUri(record.run_id, record.kind, record.name)
    return {
        "training_run_id": run.id,
        "twinkle_path": str(uri),
        "tinker_path": str(uri).replace("twinkle://", "tinker://", 1),
        "lora_config": run.lora_config,
    }


async def _readable_when_written(state: ServerState, principal: Any, uri: CheckpointUri) -> Any:
    """The checkpoint, waiting (a little) for the caller's own save of it that is still
    being written; refused with a 409 if it does not finish, never served half-written."""
    deadline = time.monotonic() + WAIT_FOR_SAVE_S
    while True:
        try:
            return checkpoint_access.readable(state.store, principal, str(uri))
        except NotFound:
            folder = state.model.checkpoint_folder(principal.key_id, uri)
            writing = any(folder.parent.glob(f".{uri.name}.tmp-*"))
            if not writing:
                raise
            if time.monotonic() > deadline:
                raise Conflict(
                    f"checkpoint {uri} is still being written: retry when its save finishes"
                ) from None
        await asyncio.sleep(0.2)


def _link(
    request: Request, state: ServerState, principal: Any, record: Any, file: str
) -> tuple[str, float]:
    expires_at = time.time() + state.config.limits.download_link_ttl_s
    grant = download_links.Grant(
        record.owner, record.run_id, record.kind, record.name, file, expires_at, principal.key_id
    )
    token = download_links.sign(download_links.server_secret(state.home), grant)
    return str(request.url_for("download", token=token)), expires_at


def _export_folder(path: str) -> Path:
    folder = Path(path) / EXPORT
    if not folder.is_dir():
        raise Conflict(
            "this export's files are not all written (its save was cut short): delete the "
            "checkpoint and save it again"
        )
    return folder
