"""Pushing a checkpoint's peft folder to a Hugging Face hub repo, from the server.

Online, the files go up with ``huggingface_hub`` (``create_repo`` then ``upload_folder``) to
its endpoint (``HF_ENDPOINT``), authenticated by the token the request carries, used for that
push only and never stored or logged; the hub refusing is a 400, a hub that cannot be reached
(or answers what the client cannot read) a 503. When the server's hub is offline
(``HF_HUB_OFFLINE``, ``TWINKLE_HUB_OFFLINE``: an air-gapped site), the push goes to the local
mirror every process of the site reads, the hub cache (``HF_HUB_CACHE``), in the hub's own layout
(``models--<org>--<name>/snapshots/<commit>/`` and ``refs/main``), so ``hf://<org>/<name>``
resolves to the pushed adapter offline, on the server and beside it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from twinkle.hub import hub_offline
from twinkle.hub.remote import cache_dir
from twinkle.server.errors import BadRequest, Unavailable
from twinkle.utils import get_logger

logger = get_logger()

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def check_repo_id(repo_id: Any) -> str:
    if not isinstance(repo_id, str) or not REPO_ID.match(repo_id) or ".." in repo_id:
        raise BadRequest(
            f"repo_id must look like 'org/name' (letters, digits, '.', '_', '-'), got {repo_id!r}"
        )
    return repo_id


def push(folder: Path, repo_id: str, token: str | None, private: bool) -> dict[str, Any]:
    """Push the files of ``folder`` to ``repo_id``; returns the repo and its new revision."""
    if hub_offline("hf"):
        return {
            "repo_id": repo_id,
            "revision": write_mirror(Path(cache_dir("hf")), repo_id, folder),
            "hub": "mirror",
        }
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            commit_message="LoRA adapter from twinkle-server",
        )
    except HfHubHTTPError as exc:
        raise BadRequest(f"the hub refused the push to {repo_id}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the hub's transport (httpx2 in hf-hub 2.x) or answer
        logger.warning(f"push to {repo_id} failed: {type(exc).__name__}: {exc}")
        raise Unavailable(
            f"the hub cannot be reached to push {repo_id} ({type(exc).__name__}: {exc}); check "
            "the server's hub endpoint (HF_ENDPOINT) and try again"
        ) from None
    return {"repo_id": repo_id, "revision": commit.oid, "hub": "hf", "url": commit.commit_url}


def write_mirror(cache: Path, repo_id: str, folder: Path) -> str:
    """The files as a new commit of ``repo_id`` in the hub cache layout; its commit id (the
    files' digest). The snapshot is written aside and renamed into place, then ``main``
    points at it, so a reader sees the old revision or the new one whole."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    digest = hashlib.sha1()
    for name in names:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes())
    commit = digest.hexdigest()
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{commit}.tmp-", dir=snapshot.parent))
        try:
            for name in names:
                shutil.copyfile(folder / name, tmp / name)
            os.rename(tmp, snapshot)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    (repo / "refs").mkdir(exist_ok=True)
    ref = repo / "refs" / ".main.tmp"
    ref.write_text(commit)
    os.replace(ref, repo / "refs" / "main")
    return commit
