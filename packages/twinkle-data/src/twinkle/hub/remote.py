"""Fetch a hub repo snapshot into a local folder, looking in the local cache first.

Every fetch first asks the hub library for a cached snapshot with
``local_files_only=True``, which never touches the network, so a cached repo
resolves at once even where the hub is unreachable (modelscope otherwise spends
seconds retrying). Only on a cache miss does it download, unless the hub is
offline: ``TWINKLE_HUB_OFFLINE=1`` for both hubs, and ``HF_HUB_OFFLINE=1`` (or
``TRANSFORMERS_OFFLINE=1``) for Hugging Face. ``HF_HUB_CACHE``, ``HF_ENDPOINT``
and ``MODELSCOPE_CACHE`` are read at call time, so setting them in
``os.environ`` after import still takes effect. modelscope is an optional
dependency, imported only when an ``ms://`` id is resolved.
"""

from __future__ import annotations

import os
from pathlib import Path

from twinkle.hub.bundled import Kind
from twinkle.hub.ids import HUBS, HubId
from twinkle.utils import get_logger

OFFLINE_ENV = "TWINKLE_HUB_OFFLINE"
CACHE_ENV = {"hf": "HF_HUB_CACHE", "ms": "MODELSCOPE_CACHE"}
_TRUE = {"1", "true", "yes", "on"}

logger = get_logger(__name__)


class HubError(OSError):
    """A hub could not provide a repo: offline and not cached, unreachable, or no such repo."""


def fetch_snapshot(hub_id: HubId, kind: Kind) -> Path:
    """The local folder holding ``hub_id``'s files (a model or dataset repo, per ``kind``)."""
    download = _hf_download if hub_id.hub == "hf" else _ms_download
    try:
        return Path(download(hub_id, kind, local_files_only=True))
    except ImportError:
        raise
    except Exception as cache_miss:
        offline_vars = _offline_vars(hub_id.hub)
        if offline_vars:
            settings = ", ".join(f"{name}={os.environ[name]}" for name in offline_vars)
            reason = f"it is not in the local cache and the hub is offline ({settings})"
            raise HubError(_message(hub_id, kind, reason)) from cache_miss
    logger.info("downloading %s %s from %s", kind, hub_id, HUBS[hub_id.hub])
    try:
        return Path(download(hub_id, kind, local_files_only=False))
    except ImportError:
        raise
    except Exception as error:
        reason = f"the download failed ({type(error).__name__}: {error})"
        raise HubError(_message(hub_id, kind, reason)) from error


def hub_offline(hub: str) -> bool:
    """Whether the environment forbids network access to ``hub`` ('ms' or 'hf')."""
    return bool(_offline_vars(hub))


def _offline_vars(hub: str) -> list[str]:
    """The set env vars that make ``hub`` offline."""
    names = [OFFLINE_ENV] + (["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"] if hub == "hf" else [])
    return [name for name in names if os.environ.get(name, "").strip().lower() in _TRUE]


def cache_dir(hub: str) -> str:
    """Where ``hub``'s library keeps snapshots, as configured now."""
    if hub == "hf":
        from huggingface_hub import constants

        return os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE
    return os.environ.get("MODELSCOPE_CACHE") or str(Path.home() / ".cache" / "modelscope")


def _hf_download(hub_id: HubId, kind: Kind, local_files_only: bool) -> str:
    from huggingface_hub import snapshot_download

    return snapshot_download(
        hub_id.repo_id,
        repo_type=kind,
        revision=hub_id.revision,
        cache_dir=os.environ.get("HF_HUB_CACHE") or None,
        endpoint=os.environ.get("HF_ENDPOINT") or None,
        local_files_only=local_files_only,
    )


def _ms_download(hub_id: HubId, kind: Kind, local_files_only: bool) -> str:
    try:
        from modelscope.hub.snapshot_download import snapshot_download
    except ImportError as error:
        raise ImportError(
            f"{hub_id} is a ModelScope id and needs the modelscope package: "
            "pip install twinkle-data[modelscope] (or use an hf:// id, a local path, or "
            "TWINKLE_DEFAULT_HUB=hf for bare org/name ids)"
        ) from error
    return snapshot_download(
        repo_id=hub_id.repo_id,
        repo_type=kind,
        revision=hub_id.revision,
        cache_dir=os.environ.get("MODELSCOPE_CACHE") or None,
        local_files_only=local_files_only,
    )


def _message(hub_id: HubId, kind: Kind, reason: str) -> str:
    name = hub_id.repo_id.split("/")[-1]
    bare = (
        f" (read as a {HUBS[hub_id.hub]} id because no local file or folder "
        f"{hub_id.repo_id!r} exists)"
        if hub_id.bare
        else ""
    )
    return (
        f"cannot get {kind} {str(hub_id)!r} from {HUBS[hub_id.hub]}{bare}: {reason}. "
        f"To use a local copy, pass its folder instead of the id "
        f"(resolve_{kind}('/path/to/{name}')), or place a snapshot of the repo in the "
        f"{HUBS[hub_id.hub]} cache ({CACHE_ENV[hub_id.hub]}={cache_dir(hub_id.hub)})."
    )
