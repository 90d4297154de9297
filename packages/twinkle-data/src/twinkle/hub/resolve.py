"""``resolve_model`` and ``resolve_dataset``: any id the user writes -> a local path."""

from __future__ import annotations

import os
from pathlib import Path

from twinkle.hub.bundled import Kind, bundled_path
from twinkle.hub.ids import BundledId, LocalId, parse_id
from twinkle.hub.remote import fetch_snapshot


def resolve_model(model_id: str | os.PathLike[str], revision: str | None = None) -> Path:
    """The local folder of a model (config, tokenizer and weight files) named by ``model_id``.

    ``model_id`` is a local folder, ``bundled://tiny-qwen3``, ``ms://org/name``,
    ``hf://org/name`` or a bare ``org/name`` (default hub), each hub id with an
    optional ``@revision``; ``revision`` is the same thing as an argument. Hub
    repos come from the local cache when present, else are downloaded. Raises
    FileNotFoundError for a missing local path, ValueError for an id that is
    malformed or names an unknown prefix or bundled model, and HubError when the
    hub cannot provide the repo; each message says how to fix it.
    """
    return _resolve(model_id, revision, "model")


def resolve_dataset(dataset_id: str | os.PathLike[str], revision: str | None = None) -> Path:
    """The local file or folder of a dataset named by ``dataset_id``.

    Same ids and errors as :func:`resolve_model`; the bundled datasets are
    ``bundled://self-cognition``, ``bundled://gsm8k`` and ``bundled://countdown``
    (folders of ``<split>.jsonl`` files). Hub ids fetch dataset repos.
    """
    return _resolve(dataset_id, revision, "dataset")


def _resolve(source: str | os.PathLike[str], revision: str | None, kind: Kind) -> Path:
    parsed = parse_id(source, revision)
    if isinstance(parsed, LocalId):
        return parsed.path
    if isinstance(parsed, BundledId):
        return bundled_path(parsed.name, kind)
    return fetch_snapshot(parsed, kind)
