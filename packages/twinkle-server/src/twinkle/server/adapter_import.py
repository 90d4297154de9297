"""Importing an external peft LoRA adapter as a checkpoint of the caller's, to train on.

The archive (a gzipped tar of a peft folder: ``adapter_config.json`` and
``adapter_model.safetensors``, at its root or in one folder) is checked before anything is
written: a LoRA whose settings a training run can hold (rank within the pool's, allowed
target modules, nothing peft would compute differently), and tensors that are exactly those
peft makes for that config on the served model (names and shapes, from the model's config
on the meta device), finite. It becomes ``weights/<name>`` of a new, slot-less training
run (``import-<hex>``), written atomically like every checkpoint; both clients then load it
(``model.load``, Tinker's ``create_training_client_from_state``) and train on.
"""

from __future__ import annotations

import io
import json
import secrets
import tarfile
import time
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from twinkle.model.checkpoint import (
    ADAPTER_FILES,
    RNG_FILE,
    TRAINER_STATE,
    atomic_folder,
    library_versions,
    write_record,
)
from twinkle.model.checkpoint import CheckpointRecord as SavedRecord
from twinkle.model.rng_state import capture_rng_state
from twinkle.server.auth import Principal
from twinkle.server.checks import integer
from twinkle.server.errors import BadRequest, Conflict
from twinkle.server.model_args import check_lora_values
from twinkle.server.model_service import LORA_KEYS, lora_summary
from twinkle.server.names import CheckpointUri
from twinkle.server.store import CheckpointRecord, TrainingRun
from twinkle.server.tinker.model_ops import UNEMBED
from twinkle.server.wire import check_allowed

UNREPRESENTABLE = (
    "use_dora",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
    "layers_to_transform",
    "layer_replication",
    "trainable_token_indices",
    "lora_bias",
)
"""peft settings that change what an adapter computes and that a training run cannot hold."""


def read_archive(raw: bytes) -> dict[str, bytes]:
    """The two peft files from a gzipped tar, at its root or under one folder; links,
    devices and paths that climb out are refused, other files ignored."""
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
            return _adapter_files(tar)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BadRequest(
            f"the body must be a gzipped tar of a peft adapter folder ({exc}); make one with "
            "`tar czf adapter.tar.gz -C <folder> .`"
        ) from None


def _adapter_files(tar: tarfile.TarFile) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for member in tar.getmembers():
        parts = [p for p in member.name.split("/") if p not in ("", ".")]
        if ".." in parts or member.name.startswith("/"):
            raise BadRequest(f"the archive's member {member.name!r} climbs out of its folder")
        if not parts or parts[-1] not in ADAPTER_FILES or len(parts) > 2:
            continue
        if not member.isfile():
            raise BadRequest(f"the archive's {member.name!r} must be a regular file")
        files[parts[-1]] = tar.extractfile(member).read()
    missing = [name for name in ADAPTER_FILES if name not in files]
    if missing:
        raise BadRequest(f"the archive holds no {' or '.join(missing)}: not a peft adapter folder")
    return files


def lora_of(state: Any, raw_config: bytes) -> LoraConfig:
    """The adapter's LoraConfig, if a training run on this server can hold it."""
    try:
        config = json.loads(raw_config)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"adapter_config.json is not JSON: {exc}") from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise BadRequest("adapter_config.json must describe a LoRA adapter (peft_type 'LORA')")
    odd = [key for key in UNREPRESENTABLE if config.get(key)]
    if odd:
        raise BadRequest(f"adapter_config.json sets {odd}, which this server's runs do not train")
    values = {key: config[key] for key in LORA_KEYS if config.get(key) is not None}
    targets = values.get("target_modules")
    if isinstance(targets, list):
        # peft saves "all-linear" as every module's full path: the layer names say the same
        # (the tensors' check below proves the two select the same modules)
        values["target_modules"] = sorted({str(t).rsplit(".", 1)[-1] for t in targets})
    check_lora_values(values)
    rank = integer(
        values.get("r", 8),
        "adapter_config.json r (model.max_rank bounds it)",
        1,
        state.config.model.max_rank,
    )
    # what a run of either client trains: the allow-list, and the unembedding (Tinker's)
    trainable = set(state.config.allow.lora_target_modules) | set(UNEMBED)
    targets = values.get("target_modules", [])
    for target in [targets] if isinstance(targets, str) else targets:
        check_allowed(target, sorted(trainable), "LoRA target module")
    try:
        return LoraConfig(**{**values, "r": rank})
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"adapter_config.json is not a valid LoRA config: {exc}") from None


def expected_shapes(model_folder: str, lora: LoraConfig) -> dict[str, tuple[int, ...]]:
    """The tensors peft makes for ``lora`` on the served model: built on the meta device
    from the model's config (no weights, no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_folder)
    with torch.device("meta"):
        model = get_peft_model(AutoModelForCausalLM.from_config(config), lora)
    state = get_peft_model_state_dict(model, save_embedding_layers=False)
    return {key: tuple(value.shape) for key, value in state.items()}


def check_tensors(raw: bytes, expected: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    try:
        tensors = load_safetensors(raw)
    except (SafetensorError, ValueError) as exc:
        raise BadRequest(f"adapter_model.safetensors cannot be read: {exc}") from None
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise BadRequest(
            "adapter_model.safetensors does not match its adapter_config.json on this server's "
            f"model: missing {missing[:3]}, unexpected {unexpected[:3]} (was it trained on "
            "another base model?)"
        )
    for key, tensor in tensors.items():
        if tuple(tensor.shape) != expected[key]:
            raise BadRequest(
                f"{key} has shape {list(tensor.shape)}; this model's LoRA needs "
                f"{list(expected[key])} (another base model, or another rank?)"
            )
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise BadRequest(f"{key} must hold finite floating-point values")
    return tensors


def import_adapter(
    state: Any, principal: Principal, name: str, files: dict[str, bytes]
) -> tuple[TrainingRun, CheckpointRecord]:
    service = state.model
    lora = lora_of(state, files[ADAPTER_FILES[0]])
    if service.model_folder is None:
        raise Conflict("this server's model has no local config to check an adapter against")
    tensors = check_tensors(files[ADAPTER_FILES[1]], expected_shapes(service.model_folder, lora))
    now = time.time()
    run = TrainingRun(
        id=f"import-{secrets.token_hex(8)}",
        owner=principal.key_id,
        session_id="",
        base_model=service.base_model,
        lora_rank=int(lora.r),
        lora_config=lora_summary(lora),
        adapter_name=name,
        created_at=now,
        last_request_time=now,
        active=False,
        user_metadata={"imported_as": name},
    )
    uri = CheckpointUri(run.id, "weights", name)
    folder = service.checkpoint_folder(principal.key_id, uri)
    state.store.add_run(run)
    _write(folder, name, lora, tensors)
    record = CheckpointRecord(
        run_id=run.id,
        kind="weights",
        name=name,
        owner=principal.key_id,
        path=str(folder),
        size_bytes=sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
        created_at=time.time(),
    )
    state.store.add_checkpoint(record)
    return run, record


def _write(folder: Path, name: str, lora: LoraConfig, tensors: dict[str, torch.Tensor]) -> None:
    """The checkpoint folder the library writes for an adapter (weights, random states and
    the record last), renamed into place whole."""
    with atomic_folder(folder, marker=TRAINER_STATE, overwrite=False) as tmp:
        lora.save_pretrained(str(tmp))
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / ADAPTER_FILES[1]))
        torch.save(capture_rng_state(), tmp / RNG_FILE)
        config = json.loads((tmp / ADAPTER_FILES[0]).read_text(encoding="utf-8"))
        write_record(
            tmp,
            SavedRecord(
                kind="adapter",
                step=0,
                accumulated_calls=0,
                gradient_accumulation_steps=1,
                adapter_name=name,
                adapter_config=config,
                versions=library_versions(),
            ),
        )
