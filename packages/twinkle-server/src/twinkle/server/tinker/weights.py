"""Tinker's ``save_weights_external``: the run's adapter exported as a plain peft folder,
``tinker://<run>/external_weights/<name>``, whose files ``external_weights_urls`` hands out
as signed links (what ``tinker_cookbook.weights.download`` fetches).

The checkpoint is saved like any other (atomically, recorded once whole); its ``export/``
sub-folder then holds the files the links serve, written aside and renamed into place, so
a link never serves half an export. With ``age_encryption_recipients`` every exported file
is encrypted to those recipients (``<file>.age``, age's own format via pyrage): whoever
holds a link without the matching identity gets only ciphertext.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyrage
from fastapi import APIRouter, Request

from twinkle.server import archive, checkpoint_access
from twinkle.server.errors import BadRequest, Conflict
from twinkle.server.names import check_name, parse_uri
from twinkle.server.routes.checkpoints_io import EXPORT, public_model_name
from twinkle.server.routes.common import caller, field, json_body, ready, state_of
from twinkle.server.tinker.submit import checked, seq_of, submit_ordered
from twinkle.server.tinker.training import expire, tinker_path, ttl_of

router = APIRouter()
MAX_RECIPIENTS = 10
AGE_SUFFIX = ".age"


@router.post("/save_weights_external")
async def save_weights_external(request: Request) -> dict:
    principal = caller(request)
    state = ready(state_of(request))
    body = await json_body(request)
    seq_id = seq_of(body)

    async def prepare() -> tuple:
        live = state.model.live_run(principal, field(body, "model_id", str))
        name = check_name(field(body, "path", str))
        return live, name, ttl_of(state, body), age_recipients(body)

    live, name, ttl, recipients = await checked(request, body.get("model_id"), seq_id, prepare)

    def work() -> dict:
        taken = state.store.get_checkpoint(principal.key_id, live.run.id, "external_weights", name)
        if checkpoint_access.live(taken) is not None:
            raise Conflict(f"external weights {name!r} exist; pick another name or delete them")
        path = state.model._save(principal, live, name, False, None, True, "external_weights")
        uri = parse_uri(path)
        record = state.store.get_checkpoint(principal.key_id, uri.run_id, uri.kind, uri.name)
        write_export(Path(record.path), public_model_name(live.run.base_model), recipients)
        expire(state, principal, uri, ttl)
        return {"type": "save_weights_external", "path": tinker_path(uri)}

    return submit_ordered(request, principal, live, seq_id, "save_weights_external", work)


def age_recipients(body: dict[str, Any]) -> list[Any] | None:
    """The request's age recipients (``age1...`` keys or SSH public keys), parsed."""
    raw = body.get("age_encryption_recipients")
    if raw is None:
        return None
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_RECIPIENTS:
        raise BadRequest(f"age_encryption_recipients must be a list of 1 to {MAX_RECIPIENTS} keys")
    parsed = []
    for key in raw:
        kind = pyrage.x25519 if isinstance(key, str) and key.startswith("age1") else pyrage.ssh
        try:
            parsed.append(kind.Recipient.from_str(key))
        except (pyrage.RecipientError, TypeError, ValueError) as exc:
            raise BadRequest(f"age recipient {str(key)[:40]!r} is not a valid key: {exc}") from None
    return parsed


def write_export(folder: Path, base_model: str, recipients: list[Any] | None) -> None:
    """The peft files of the checkpoint at ``folder``, encrypted when there are recipients,
    into ``folder/export`` (written aside, renamed into place)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{EXPORT}.tmp-", dir=folder))
    try:
        names = archive.export_files(folder, base_model, tmp)
        if recipients:
            for name in names:
                plain = tmp / name
                pyrage.encrypt_file(str(plain), str(tmp / f"{name}{AGE_SUFFIX}"), recipients)
                plain.unlink()
        os.rename(tmp, folder / EXPORT)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
